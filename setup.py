"""gsync — GRASP-02 proactive sync worker for a GRASP relay."""
from setuptools import find_packages, setup

setup(
    name="gsync",
    version="0.1.0",
    description="GRASP-02 proactive sync worker: keeps a GRASP relay complete",
    packages=find_packages(include=["gsync", "gsync.*"]),
    python_requires=">=3.11",
    install_requires=[
        "gevent>=24.2,<27",
        "websocket-client>=1.7,<2",
        "coincurve>=20,<22",
        "prometheus-client>=0.20,<1",
        "structlog>=24.1,<27",
    ],
    extras_require={
        # nostr-sdk ships LocalRelay: the real relay used by tests, benchmarks and `gsync demo`.
        "demo": ["nostr-sdk==0.45.1"],
        "test": [
            # pytest 9 ignores the rename (nodeid@group) by which pytest-xdist 3.8 keeps an
            # xdist_group on one worker: every worker then builds the group's costly fixture
            # again (tests/conftest.py fails the run if that happens).
            "pytest>=8,<9",
            "pytest-timeout>=2.3,<3",
            "pytest-xdist>=3.5,<4",  # the suite runs on ten workers (pytest.ini, tests/conftest.py)
            "hypothesis>=6.100,<7",
            "nostr-sdk==0.45.1",
            # nostr_relay: a second relay implementation as a real peer (tests/nostr_relay_peer.py),
            # run as a subprocess, never imported. It patches uvicorn's `websockets` server,
            # which uvicorn has deprecated: held at the versions it was tested with.
            "nostr-relay==1.14",
            "uvicorn[standard]>=0.30,<0.56",
            "websockets<18",
        ],
    },
    entry_points={"console_scripts": ["gsync=gsync.ops.cli:main"]},
    scripts=["bin/negentropy-harness"],  # `gsync` itself is the console script
)
