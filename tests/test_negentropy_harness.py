"""bin/negentropy-harness speaks the line protocol of hoytech/negentropy's interop suite.

``drive`` does what the suite's test/fuzz.pl does: two harness processes joined by pipes,
items written to each, ``seal``, ``initiate`` to the first, then every ``msg`` line copied
to the other side until the client prints ``done``; ``have``/``need`` lines are applied to
the two id sets, which must end equal. The checks from test/protoversion.pl follow.
"""
import os
import random
import subprocess

import pytest

HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "negentropy-harness")


def start_harness(frame_size_limit=None):
    env = {k: v for k, v in os.environ.items() if k != "FRAMESIZELIMIT"}
    env.pop("PYTHONPATH", None)  # the script must find gsync by itself
    if frame_size_limit is not None:
        env["FRAMESIZELIMIT"] = str(frame_size_limit)
    return subprocess.Popen(
        [HARNESS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",  # not the repo: the script's own path must be enough
    )


def make_sets(seed, records, p1, p2, p3, clustered=False):
    """Items for side 1 only / side 2 only / both with weights p1:p2:p3, as fuzz.pl does."""
    r = random.Random(seed)
    total = p1 + p2 + p3
    side1, side2 = [], []

    def place(created, mode):
        item = (created, r.randbytes(32).hex())
        if mode < p1 / total:
            side1.append(item)
        elif mode < (p1 + p2) / total:
            side2.append(item)
        else:
            side1.append(item)
            side2.append(item)

    if clustered:  # runs of consecutive timestamps that all fall on the same side
        current = 0
        for _ in range(r.randrange(records)):
            mode = r.random()
            for _ in range(r.randrange(50) + 1):
                place(1_677_970_534 + current, mode)
                current += 1
    else:
        for _ in range(records):
            place(1_677_970_534 + r.randrange(records), r.random())
    return side1, side2


def drive(side1, side2, limit1=None, limit2=None):
    """Returns (ids1, ids2, rounds, bytes up, bytes down) after a complete exchange."""
    h1, h2 = start_harness(limit1), start_harness(limit2)
    try:
        h1.stdin.write("".join(f"item,{t},{i}\n" for t, i in side1) + "seal\ninitiate\n")
        h2.stdin.write("".join(f"item,{t},{i}\n" for t, i in side2) + "seal\n")
        h1.stdin.flush()
        h2.stdin.flush()
        ids1, ids2 = {i for _, i in side1}, {i for _, i in side2}
        rounds = up = down = 0
        while True:
            line = h1.stdout.readline().rstrip("\n")
            kind, _, data = line.partition(",")
            if kind == "need":
                ids1.add(data)
            elif kind == "have":
                ids2.add(data)
            elif kind == "done":
                break
            elif kind == "msg":
                up += len(data) // 2
                h2.stdin.write(line + "\n")
                h2.stdin.flush()
                answer = h2.stdout.readline().rstrip("\n")
                assert answer.startswith("msg,"), f"unexpected line from the server: {answer!r}"
                down += (len(answer) - 4) // 2
                h1.stdin.write(answer + "\n")
                h1.stdin.flush()
                rounds += 1
            else:
                raise AssertionError(f"unexpected line from the client: {line!r} {h1.stderr.read()}")
        return ids1, ids2, rounds, up, down
    finally:
        for h in (h1, h2):
            h.kill()
            h.wait()
            for f in (h.stdin, h.stdout, h.stderr):
                f.close()


@pytest.mark.parametrize(
    "records, weights, limit1, limit2",
    [
        (0, (1, 1, 98), None, None),
        (1, (1, 0, 0), None, None),
        (5_000, (1, 0, 0), None, None),
        (5_000, (0, 1, 0), None, None),
        (5_000, (0, 0, 1), None, None),
        (5_000, (2, 2, 7), None, None),
        (20_000, (1, 1, 5), 60_000, 500_000),
        (10_000, (1, 1, 10), 4096, 4096),
        (10_000, (0, 1, 0), 0, 4096),
    ],
)
def test_two_harnesses_reconcile_like_the_reference_fuzz_driver(records, weights, limit1, limit2):
    side1, side2 = make_sets(records, records, *weights)
    ids1, ids2, _, _, _ = drive(side1, side2, limit1, limit2)
    assert ids1 == ids2 == {i for _, i in side1 + side2}


@pytest.mark.parametrize("limits", [(None, None), (50_000, 50_000)])
def test_two_harnesses_reconcile_clustered_timestamps(limits):
    side1, side2 = make_sets(7, 300, 1, 1, 1, clustered=True)
    ids1, ids2, _, _, _ = drive(side1, side2, *limits)
    assert ids1 == ids2 == {i for _, i in side1 + side2}


def test_equal_sets_take_one_round_and_the_answer_is_the_bare_version_byte():
    side, _ = make_sets(3, 2_000, 0, 0, 1)
    ids1, ids2, rounds, up, down = drive(side, side)
    assert (rounds, down) == (1, 1)
    assert up < 16 * (16 + 5)  # 16 fingerprinted buckets with short bounds, not 2,000 ids


def run_lines(lines, frame_size_limit=None):
    h = start_harness(frame_size_limit)
    out, err = h.communicate("".join(line + "\n" for line in lines), timeout=30)
    return h.returncode, out.splitlines(), err


ITEM = "item,12345,eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"


def test_server_answers_a_newer_version_with_61_then_accepts_version_1():
    # test/protoversion.pl: the answer to "62..." is exactly "msg,61", and a retry with
    # version 1 gets the same answer as a first attempt with version 1.
    code, first, _ = run_lines([ITEM, "seal", "msg,6100000200"])
    code2, lines, _ = run_lines([ITEM, "seal", "msg,62aabbccddeeff", "msg,6100000200"])
    assert code == code2 == 0
    assert lines == ["msg,61", first[0]]
    assert first == ["msg,6100000201" + "ee" * 32]  # all of our one item, as an id list


def test_client_prints_have_and_need_then_done_and_the_server_prints_only_messages():
    mine, theirs = "aa" * 32, "bb" * 32
    _, server_out, _ = run_lines([f"item,10,{theirs}", "seal", "msg,6100000200"])
    code, client_out, _ = run_lines([f"item,10,{mine}", "seal", "initiate", server_out[0]])
    assert code == 0
    assert client_out == [f"msg,6100000201{mine}", f"have,{mine}", f"need,{theirs}", "done"]


def test_blank_lines_are_ignored_and_an_empty_set_initiates_with_an_empty_id_list():
    code, lines, _ = run_lines(["", "seal", "", "initiate"])
    assert (code, lines) == (0, ["msg,6100000200"])


@pytest.mark.parametrize(
    "lines",
    [
        ["item,1"],  # wrong number of fields
        ["bogus"],
        ["seal", "msg,61000002"],  # truncated message
        ["seal", "msg,zz"],
        ["seal", "initiate", "msg,62"],  # the client cannot downgrade to an unknown version
    ],
)
def test_bad_input_is_fatal_with_a_reason_on_stderr(lines):
    code, _, err = run_lines(lines)
    assert code != 0 and "negentropy-harness:" in err


def test_frame_size_limit_comes_from_the_environment():
    side1, _ = make_sets(11, 3_000, 0, 0, 1)
    _, server = make_sets(11, 3_000, 0, 1, 0)
    h = start_harness(4096)
    lines = [f"item,{t},{i}" for t, i in server] + ["seal", "msg,6100000200"]
    out, _ = h.communicate("".join(line + "\n" for line in lines), timeout=30)
    message = out.splitlines()[0]
    assert message.startswith("msg,") and (len(message) - 4) // 2 <= 4096
    code, _, err = run_lines(["seal"], frame_size_limit=100)  # too small: refused at seal
    assert code != 0 and "frame size limit" in err

