"""A test-only fault hook for the engine process: make steps raise or hang on demand.

Set CADENCE_FAULT_FILE=/some/path in the server's environment. Before each forward pass the
engine then looks for that file; if it exists, it reads one command from it and deletes it:

    raise       the next step raises an exception
    raise N     the next N steps raise
    hang S      the next step sleeps S seconds (a wedged engine), then carries on

The fault strikes after the step's schedule and its model-runner deltas were applied (the
forward pass is launched), the hardest place to recover from. Without the variable nothing
is installed: the hook costs nothing in production.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)

ENV_VAR = "CADENCE_FAULT_FILE"


class InjectedFault(RuntimeError):
    """What a step raises when the fault file says so."""


class FaultInjector:
    def __init__(self, path: str) -> None:
        self.path = path
        self.raises_left = 0

    def check(self) -> None:
        """Called once per step: apply a pending command, if any."""
        if self.raises_left == 0 and os.path.exists(self.path):
            self._read_command()
        if self.raises_left > 0:
            self.raises_left -= 1
            raise InjectedFault("injected fault (CADENCE_FAULT_FILE)")

    def _read_command(self) -> None:
        try:
            with open(self.path) as f:
                words = f.read().split()
            if not words:
                return  # being written: look again next step (writers should rename)
            os.unlink(self.path)
        except OSError:
            return
        verb, arg = words[0], words[1] if len(words) > 1 else None
        logger.warning("fault hook: %s", " ".join(words))
        if verb == "raise":
            self.raises_left = int(arg or 1)
        elif verb == "hang":
            time.sleep(float(arg or 3600))
        else:
            logger.error("fault hook: unknown command %r", verb)


def install_from_env(core) -> FaultInjector | None:
    """Wrap `core.runner.execute_model` with the hook if CADENCE_FAULT_FILE is set."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    injector = FaultInjector(path)
    runner = core.runner
    execute_model = runner.execute_model

    def faulty_execute_model(sched):
        out = execute_model(sched)
        if not sched.is_empty:
            injector.check()
        return out

    runner.execute_model = faulty_execute_model
    logger.warning("fault hook armed: %s=%s", ENV_VAR, path)
    return injector
