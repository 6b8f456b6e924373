"""tests/forks.py: what a forked gsync inherits is what every gsync starts with, never what
one test gave its own gsync (a fault injected through a ``sitecustomize`` once reached every
later gsync of its pytest worker, through the zygote it started)."""
import os

from . import forks
from .gsync_proc import ROOT, GsyncProcess


def test_a_gsync_given_its_own_interpreter_environment_is_not_forked_nor_passes_it_on(
        relay_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(forks, "_zygotes", {})  # this test's requests start the zygotes
    own = relay_factory()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "open(os.path.join(os.path.dirname(__file__), f'ran-{os.getpid()}'), 'w').close()\n")
    odd = GsyncProcess(own)
    odd.env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    plain = GsyncProcess(own)
    try:
        odd.start()  # the first gsync this worker's zygote would have been started for
        plain.start()
        ran = sorted(p.name for p in site.glob("ran-*"))
        assert ran == [f"ran-{odd.proc.pid}"], f"the sitecustomize ran in {ran}, not only in {odd.proc.pid}"
        assert isinstance(plain.proc, forks.ForkedProc), "gsync was not forked"
    finally:
        odd.terminate()
        plain.terminate()
