"""A deterministic simulator of the public network around gsync (``sim.Simulation``):
gsync's real manager, simulated relays and an own relay, a seeded world with faults,
invariants checked as it runs. ``bench/simulate`` runs it from the command line."""
from .sim import SimOptions, SimResult, Simulation

__all__ = ["SimOptions", "SimResult", "Simulation", "run"]


def run(**options) -> SimResult:
    return Simulation(SimOptions(**options)).run()
