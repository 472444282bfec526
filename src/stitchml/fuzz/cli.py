"""`python -m stitchml.fuzz`: many cases on worker processes, or one case verbosely."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import torch

from .cases import CaseResult, run_case
from .programs import DEVICE, PROFILES, generate
from .shrink import reduce_program


def _worker_init() -> None:
    torch.set_num_threads(1)


def _timed_case(args: tuple[int, str, int]) -> CaseResult:
    import signal

    seed, profile, timeout = args

    def alarm(signum, frame):
        raise TimeoutError(f"case took over {timeout} s")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        return run_case(seed, profile)
    except TimeoutError as e:
        return CaseResult(seed, "fail", str(e), generate(seed, profile).describe(), float(timeout))
    finally:
        signal.alarm(0)


def summarize(results: list[CaseResult], seconds: float) -> str:
    by = {s: sum(r.status == s for r in results) for s in ("pass", "skip", "fail", "error")}
    ops = sum(r.num_ops for r in results)
    lines = [f"fuzz: {len(results)} cases ({ops} ops) in {seconds:.0f} s: {by['pass']} passed, "
             f"{by['skip']} without verdict (eager overflow, or upstream: aot_eager equally wrong), {by['fail']} failed, {by['error']} fuzzer errors"]
    if results:
        worst = max(results, key=lambda r: r.worst if r.status == "pass" else 0.0)
        lines.append(f"closest pass: seed {worst.seed}, compiled error {worst.worst:.2f}x allowed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stitchml.fuzz", description=sys.modules[__package__].__doc__.split("\n\n")[0])
    p.add_argument("-n", "--cases", type=int, default=200, help="number of cases (seeds start..start+n-1)")
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--seed", type=int, default=None, help="run one case verbosely (its source and verdict)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="long")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--timeout", type=int, default=300, help="seconds per case before it counts as failed")
    p.add_argument("--log", default="", help="also append every failing line to this file")
    p.add_argument("--reduce", action="store_true", help="with --seed: shrink a failing program")
    args = p.parse_args(argv)
    _require_interpreter()

    if args.seed is not None:
        prog = generate(args.seed, args.profile)
        print(prog.describe())
        print(prog.source())
        r = run_case(args.seed, args.profile)
        print(r.line(), f"({r.seconds:.1f} s, {r.graphs} graphs)")
        if args.reduce and r.status in ("fail", "error"):
            small, rr = reduce_program(prog)
            print("reduced:", rr.line())
            print(small.source())
        return 0 if r.status in ("pass", "skip") else 1

    t0 = time.perf_counter()
    seeds = list(range(args.start, args.start + args.cases))
    results: list[CaseResult] = []

    def record(r: CaseResult) -> None:
        results.append(r)
        if r.status in ("fail", "error"):
            print(r.line(), flush=True)
            if args.log:
                with open(args.log, "a") as f:
                    f.write(r.line() + "\n")
        if len(results) % 100 == 0:
            bad = sum(x.status in ("fail", "error") for x in results)
            print(f"... {len(results)}/{len(seeds)} cases, {bad} failing, {time.perf_counter() - t0:.0f} s", flush=True)

    if args.jobs <= 1:
        for s in seeds:
            record(_timed_case((s, args.profile, args.timeout)))
    else:
        _run_pool(seeds, args, record)
    results.sort(key=lambda r: r.seed)
    print(summarize(results, time.perf_counter() - t0))
    return 1 if any(r.status in ("fail", "error") for r in results) else 0


RECYCLE = 150  # cases per worker process before it is replaced


def _run_pool(seeds: list[int], args, record: Callable[[CaseResult], None]) -> None:
    """Cases on worker processes, a fresh pool per batch of RECYCLE cases per worker (a
    long-lived process accumulates compiled kernels; `max_tasks_per_child` is not used
    because the executor can hang when its workers retire).  A pool whose workers die
    (killed from outside, or a crash) or that stops making progress is replaced and the
    unfinished seeds are resubmitted; a seed that was running when that happened 3
    times counts as failed."""
    import concurrent.futures as cf
    import multiprocessing as mp

    pending, attempts = list(seeds), {s: 0 for s in seeds}
    while pending:
        pool = cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)
        batch = pending[:args.jobs * RECYCLE]
        futures = {pool.submit(_timed_case, (s, args.profile, args.timeout)): s for s in batch}
        done: set[int] = set()
        lost = False
        try:
            left = set(futures)
            while left:
                finished, left = cf.wait(left, timeout=args.timeout + 120, return_when=cf.FIRST_COMPLETED)
                if not finished:
                    raise cf.TimeoutError(f"no case finished in {args.timeout + 120} s")
                for fut in finished:
                    record(fut.result())
                    done.add(futures[fut])
        except (cf.process.BrokenProcessPool, cf.TimeoutError) as e:
            lost = True
            running = [s for f, s in futures.items() if f.running() and s not in done]
            print(f"... worker pool lost ({type(e).__name__}); resubmitting {len(futures) - len(done)} cases",
                  flush=True)
            for s in running:
                attempts[s] += 1
                if attempts[s] >= 3:
                    record(CaseResult(s, "fail", f"worker process died or hung 3 times ({type(e).__name__})",
                                      f"seed={s} profile={args.profile}", 0.0))
                    done.add(s)
        finally:
            if lost:  # our own workers, if any is still there (a hung one)
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    if proc.is_alive():
                        proc.kill()
            pool.shutdown(wait=True, cancel_futures=True)
        pending = [s for s in pending if s not in done]


def _require_interpreter() -> None:
    if DEVICE.type == "cuda":
        return
    from ..compiler import _interpreter_on
    if not _interpreter_on():
        sys.exit("stitchml.fuzz: no CUDA GPU, so set TRITON_INTERPRET=1 before starting (the Triton interpreter)")
