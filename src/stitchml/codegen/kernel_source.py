"""A generated kernel as data: parameters, body lines, launch shape."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KernelSource:
    name: str
    params: list[tuple[str, int]]   # (kind, node id): kind in in/out/seed/partial
    param_names: list[str]
    body: list[str]                 # statements; the program id is written `tl.program_id(0)`
    grid: int
    num_warps: int
    levels: dict[int, frozenset]    # node id → axes it was evaluated over (for tests / explain)

    @property
    def source(self) -> str:
        # a seed or barrier base changes every call: specialising on its value (== 1, a
        # multiple of 16) would compile a new variant for some calls
        fresh = [n for (kind, _), n in zip(self.params, self.param_names) if kind in ("seed", "base")]
        deco = f"@triton.jit(do_not_specialize={fresh!r})" if fresh else "@triton.jit"
        return (f"{deco}\ndef {self.name}({', '.join(self.param_names)}):\n"
                + "\n".join("    " + line for line in self.body) + "\n")


__all__ = ["KernelSource"]
