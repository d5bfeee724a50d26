"""Run the fuzz harness for a while: ``python -m fuzz.run --seconds 600`` from the repository root.

Alternates the properties (calls, hand-edited states, token files and the command line reading
them, rewinds, attribute edits, pickling and forks mid-stream) in rounds until the time is up,
then prints what it tried. A failing example stops the run with hypothesis' report; a warning
is an error; a hang is killed by a watchdog with a traceback (``-X faulthandler`` is optional).
``tests/test_fuzz.py`` runs the same properties for a small, fixed number of examples;
``.ci/fuzz`` runs this for a bounded time against the debug build.
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import hypothesis
from hypothesis import HealthCheck, given, settings

from fuzz.checks import (
    check_call,
    check_cli_file,
    check_lifecycle,
    check_mixture,
    check_mixture_state_edit,
    check_reshaped_resume,
    check_state_edit,
    check_token_file,
)
from fuzz.packing_runs import check_packed_run, packed_runs
from fuzz.runs import check_mixture_reshaped_resume, check_split
from fuzz.strategies import (
    call_kwargs,
    document_calls,
    lifecycle_events,
    mixture_calls,
    reshaped_mixture_runs,
    reshaped_runs,
    resumable_calls,
    resumable_mixture_calls,
    split_calls,
    state_edits,
    token_files,
    token_inputs,
)
from tokstream.corpus import EosNotFoundWarning

# A call that has not finished after this long is a hang.
HANG_SECONDS = 120


class Tally:
    """What the fuzzer tried, for the report."""

    def __init__(self) -> None:
        self.executions = 0
        self.outcomes: dict[str, int] = {}

    def add(self, outcome: str) -> None:
        self.executions += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def guarded(function, *args):
    """Run one example with warnings as errors and a watchdog against hangs."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            # Advice to a user whose eos= is absent; the model draws eos values freely.
            warnings.filterwarnings("ignore", category=EosNotFoundWarning)
            return function(*args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def run(seconds: float, examples: int, seed: int | None) -> Tally:
    """Alternate the two properties in rounds of ``examples`` until ``seconds`` have passed."""
    tally = Tally()
    common = settings(
        deadline=None,
        database=None,
        max_examples=examples,
        suppress_health_check=list(HealthCheck),
    )

    @common
    @given(tokens=token_inputs(), kwargs=call_kwargs())
    def calls(tokens, kwargs):
        tally.add("call " + guarded(check_call, tokens, kwargs))

    @common
    @given(call=resumable_calls(documents=True), edit=state_edits())
    def states(call, edit):
        tokens, kwargs, steps = call
        tally.add("state " + guarded(check_state_edit, tokens, kwargs, steps, edit))

    @common
    @given(call=resumable_mixture_calls(), edit=state_edits())
    def mixture_states(call, edit):
        tally.add(guarded(check_mixture_state_edit, *call, edit))

    @common
    @given(run=reshaped_runs())
    def reshapes(run):
        tally.add(guarded(check_reshaped_resume, *run))

    directory = Path(tempfile.mkdtemp(prefix="tokstream_fuzz_"))

    @common
    @given(token_file=token_files())
    def files(token_file):
        tally.add(guarded(check_token_file, directory, token_file))
        tally.add(guarded(check_cli_file, directory, token_file))

    @common
    @given(call=resumable_calls(), event=lifecycle_events)
    def lifecycles(call, event):
        tokens, kwargs, steps = call
        tally.add(guarded(check_lifecycle, tokens, kwargs, steps, event, directory))

    @common
    @given(call=document_calls())
    def documents(call):
        tally.add("documents " + guarded(check_call, *call))

    @common
    @given(call=mixture_calls())
    def mixtures(call):
        tally.add(guarded(check_mixture, *call))

    @common
    @given(run=reshaped_mixture_runs())
    def staged_mixtures(run):
        tally.add(guarded(check_mixture_reshaped_resume, *run))

    @common
    @given(call=split_calls())
    def splits(call):
        tally.add(guarded(check_split, *call))

    @common
    @given(run=packed_runs())
    def packed(run):
        tally.add(guarded(check_packed_run, *run))

    stop = time.monotonic() + seconds
    try:
        for round_number in itertools.count():
            tests = (
                calls,
                states,
                reshapes,
                files,
                lifecycles,
                documents,
                mixtures,
                mixture_states,
                staged_mixtures,
                splits,
                packed,
            )
            for test in tests:
                (test if seed is None else hypothesis.seed(seed + round_number)(test))()
            if time.monotonic() >= stop:
                return tally
    finally:
        shutil.rmtree(directory)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long")
    parser.add_argument(
        "--examples", type=int, default=200, help="examples per round of each property"
    )
    parser.add_argument("--seed", type=int, default=None, help="reproduce a run")
    args = parser.parse_args(argv)
    started = time.monotonic()
    tally = run(args.seconds, args.examples, args.seed)
    elapsed = time.monotonic() - started
    print(
        f"fuzz: {tally.executions} executions in {elapsed:.1f} s "
        f"({tally.executions / max(elapsed, 1e-9):.0f}/s)"
    )
    for outcome, count in sorted(tally.outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {count:8d}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
