"""The reference for stitch's in-kernel random numbers (tests/test_random.py and its GPU
twin in tests/test_gpu.py): element i's uniform is word i & 3 of the Philox block at
i >> 2, computed here with Triton's own `randint4x`, and the seeds a compiled call draws."""
import torch


class RecordedSeeds:
    """The seeds compiled calls drew: host draws (`wrapper._seeds`) as they happen, and the
    device seed buffers of CUDA-graph mode (`SeedBuffer`, redrawn on the device per call,
    also inside a replay) read when iterated, after the call: each holds its last call's."""

    def __init__(self) -> None:
        self.host: list[int] = []
        self.buffers: list = []

    def __iter__(self):
        yield from self.host
        for b in self.buffers:
            if b.buf is not None:
                yield from b.buf.tolist()

    def clear(self) -> None:
        self.host.clear()
        self.buffers.clear()


def recorded_seeds(monkeypatch) -> RecordedSeeds:
    """The seeds the compiled calls draw from now on, host-drawn or device-drawn."""
    from stitchml.runtime import cuda_graphs, wrapper

    drawn = RecordedSeeds()
    real = wrapper._seeds

    def recording(k: int) -> list[int]:
        out = real(k)
        drawn.host.extend(out)
        return out
    monkeypatch.setattr(wrapper, "_seeds", recording)
    real_draw = cuda_graphs.SeedBuffer.draw

    def draw_recorded(buffer) -> tuple:
        if buffer not in drawn.buffers:
            drawn.buffers.append(buffer)
        return real_draw(buffer)
    monkeypatch.setattr(cuda_graphs.SeedBuffer, "draw", draw_recorded)
    return drawn


def four_word_uniforms(seed: int, n: int, device: str = "cpu") -> torch.Tensor:
    """Element i's uniform under the four-words scheme, from Triton's own `randint4x`:
    word i & 3 of the Philox block at i >> 2, converted as `tl.rand` converts a word."""
    import triton
    import triton.language as tl

    @triton.jit
    def four_words(seed, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a, b, c, d = tl.randint4x(seed, i)
        m = i * 4 < n
        tl.store(out + i * 4, tl.random.uint_to_uniform_float(a), mask=m)
        tl.store(out + i * 4 + 1, tl.random.uint_to_uniform_float(b), mask=m)
        tl.store(out + i * 4 + 2, tl.random.uint_to_uniform_float(c), mask=m)
        tl.store(out + i * 4 + 3, tl.random.uint_to_uniform_float(d), mask=m)

    out = torch.full((-(-n // 4096) * 4096,), -1.0, device=device)   # (poisoned)
    four_words[(-(-n // 4096),)](seed, out, n, BLOCK=1024)
    return out[:n]
