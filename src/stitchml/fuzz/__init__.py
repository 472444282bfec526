"""Differential fuzzer: seeded random programs of memory-intensive ops, compiled by a
fresh `StitchBackend`, checked against eager PyTorch (DESIGN §5).

A program is straight-line Python source (`v3 = torch.softmax(v2, -1)`, ...), so a
failing case prints as one reproducible line and `python -m stitchml.fuzz --seed S`
replays it with its source.  Each case draws from its seed: dtype (fp32 / fp16 /
bf16), with or without backward, input shapes (size-1 dims, primes, non-powers of
two, rank ≤ 4) and layouts (contiguous, permuted, strided slices, offsets, expanded),
2–30 ops, and a few stitchml knobs (block sizes that force looped and packed rows,
launch fusion on or off) so small shapes still reach every kernel form; from seed 33600 a
quarter of the programs are compiled with symbolic sizes (`dynamic=True`: the dynamic
stage's probes and templates).

Verdict per output and per input gradient: a float64 eager run is the judge; the
compiled error may not exceed twice eager's own error plus a small tolerance scaled
to the result (for fp32 it may alternatively match eager within the usual fp32
tolerance).  No verdict where eager itself overflows (inf/nan).  A case also fails if
any graph fell back wholly to eager (`eager_reason`), if the compiled run raises, or
if it returns non-finite values where eager does not, or if the pipeline raised at a
dynamic graph's probe size.

    python -m stitchml.fuzz -n 10000 --jobs 2     # summary; exit 1 on any failure
    python -m stitchml.fuzz --seed 1234           # one case: its source and verdict
"""
from .cases import CaseResult, Verdict, check, judge, make_inputs, run_case, run_many
from .cli import main, summarize
from .programs import DEVICE, DTYPES, PROFILES, InputSpec, Profile, Program, generate
from .shrink import reduce_program

__all__ = ["CaseResult", "DEVICE", "DTYPES", "InputSpec", "PROFILES", "Profile", "Program", "Verdict", "check",
           "generate", "judge", "main", "make_inputs", "reduce_program", "run_case", "run_many", "summarize"]
