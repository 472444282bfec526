"""The models suite: whole training steps and inference calls.

BERT-base (training batch 16 x 128; inference batch 1 and 16) and GPT-2 small
(training b8 s512; one batch-1 decoding step against a KV cache) from Hugging Face
`transformers` configs with random weights (nothing is downloaded); a LLaMA-style
8-layer training step (hidden 1024, GQA 16/4 heads, SwiGLU, RMSNorm, rotary, b4 s1024,
with its LM head and loss), a LLaMA-style 7B-sized decoder block (RMSNorm, rotary
embeddings, SwiGLU) and a DIEN-like recommender block
(embeddings, GRU interest extractor, attention over the behaviour sequence, AUGRU,
MLP) written here.  Issue 18's rows (families `issue18_*`): ResNet-50 training in
channels-last memory format (batch 32, 224 px) and Swin-T training from torchvision, and
a small Mixtral-style MoE decoder's training step from `transformers`.  A training row
that misses its tolerance against eager is judged against the same step in float64
(`float64_step`; eager's own BatchNorm gradients can be the inaccurate ones).

Dropout is 0 everywhere so that every contender can be checked value for value
against eager (dropout kernels are measured by the micro suite).  Attention is plain
matmul + softmax (`attn_implementation="eager"`), the same for every contender, so
the softmax and masking are memory-intensive ops that compilers can fuse.  A
training step is forward + backward (gradients of every parameter); the optimizer is
not part of it.  Byte floors are not reported: matrix products dominate.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .compare import tolerance
from .workload import DTYPES, CaseSpec, Workload, flat_tensors

# --------------------------------------------------------------------------- LLaMA-style block


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)           # [seq, head_dim]
    return angles.cos(), angles.sin()


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(rms(x)) with rotary q/k and a causal mask,
    then + down(silu(gate(rms(h))) * up(rms(h)))."""

    def __init__(self, hidden: int, heads: int, ffn: int, kv_heads: int | None = None):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.kv_heads = kv_heads or heads          # grouped-query attention when fewer than heads
        kv_dim = self.kv_heads * self.head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.o = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.k, self.v = nn.Linear(hidden, kv_dim, bias=False), nn.Linear(hidden, kv_dim, bias=False)
        self.gate, self.up = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, hid = x.shape
        h = self.attn_norm(x)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(b, s, n, self.head_dim).transpose(1, 2)

        def shared(t: torch.Tensor) -> torch.Tensor:
            # GQA: each key/value head serves heads // kv_heads query heads
            rep = self.heads // self.kv_heads
            if rep == 1:
                return t
            return t[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s,
                                                                                       self.head_dim)
        q, k, v = heads(self.q(h), self.heads), heads(self.k(h), self.kv_heads), heads(self.v(h), self.kv_heads)
        q = q * cos + _rotate_half(q) * sin
        k = shared(k * cos + _rotate_half(k) * sin)
        v = shared(v)
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(self.head_dim)) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        attn = (probs @ v).transpose(1, 2).reshape(b, s, hid)
        x = x + self.o(attn)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaModel(nn.Module):
    """A LLaMA-style decoder (written here, no download): token embedding, `layers`
    pre-norm blocks (RMSNorm, rotary q/k, GQA, causal matmul+softmax attention, SwiGLU),
    a final RMSNorm, an untied LM head and the next-token cross-entropy loss."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(LlamaBlock(hidden, heads, ffn, kv_heads) for _ in range(layers))
        self.norm, self.head = RMSNorm(hidden), nn.Linear(hidden, vocab, bias=False)
        cos, sin = rotary_tables(seq, hidden // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# --------------------------------------------------------------------------- DIEN-like block


class DIENBlock(nn.Module):
    """A DIEN-like click-through model: item and category embeddings of a behaviour
    sequence, a GRU over it (interest extraction), attention of the target item over
    the GRU states, an AUGRU (GRU whose update gate is scaled by the attention) for
    interest evolution, and an MLP on [final interest, target, pooled history].
    The recurrences are written out step by step (as TensorFlow's DIEN is), so each
    step is two small matrix products and a dozen element-wise ops."""

    def __init__(self, items: int, cats: int, emb: int, hidden: int, mlp: tuple[int, int]):
        super().__init__()
        self.item_emb, self.cat_emb = nn.Embedding(items, emb), nn.Embedding(cats, emb)
        e2 = 2 * emb
        self.gru_x, self.gru_h = nn.Linear(e2, 3 * hidden), nn.Linear(hidden, 3 * hidden)
        self.query = nn.Linear(e2, hidden)
        self.att1, self.att2 = nn.Linear(4 * hidden, 36), nn.Linear(36, 1)
        self.au_x, self.au_h = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, 3 * hidden)
        self.fc1, self.fc2, self.out = nn.Linear(hidden + 2 * e2, mlp[0]), nn.Linear(*mlp), nn.Linear(mlp[1], 1)
        self.act1, self.act2 = nn.PReLU(mlp[0]), nn.PReLU(mlp[1])

    @staticmethod
    def _gru_cell(gx: torch.Tensor, gh: torch.Tensor, h: torch.Tensor, att: torch.Tensor | None) -> torch.Tensor:
        xr, xz, xn = gx.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        if att is not None:           # AUGRU: attention scales the update gate
            z = att * z
            return (1 - z) * h + z * n
        return (1 - z) * n + z * h

    def forward(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, tgt_item: torch.Tensor,
                tgt_cat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seq = torch.cat([self.item_emb(hist_items), self.cat_emb(hist_cats)], -1)     # [B, T, 2E]
        tgt = torch.cat([self.item_emb(tgt_item), self.cat_emb(tgt_cat)], -1)         # [B, 2E]
        b, t_len, _ = seq.shape
        hidden = self.gru_h.in_features
        gx_all = self.gru_x(seq)
        h = seq.new_zeros(b, hidden)
        states = []
        for t in range(t_len):
            m = mask[:, t:t + 1]
            h = m * self._gru_cell(gx_all[:, t], self.gru_h(h), h, None) + (1 - m) * h
            states.append(h)
        hs = torch.stack(states, 1)                                                   # [B, T, H]
        q = self.query(tgt).unsqueeze(1).expand_as(hs)
        feats = torch.cat([hs, q, hs * q, hs - q], -1)
        scores = self.att2(torch.sigmoid(self.att1(feats))).squeeze(-1)              # [B, T]
        scores = scores.masked_fill(mask == 0, -1e4)
        att = torch.softmax(scores.float(), -1).to(hs.dtype)
        ax_all = self.au_x(hs)
        h = seq.new_zeros(b, hidden)
        for t in range(t_len):
            m = mask[:, t:t + 1]
            h = m * self._gru_cell(ax_all[:, t], self.au_h(h), h, att[:, t:t + 1]) + (1 - m) * h
        pooled = (seq * mask.unsqueeze(-1)).sum(1)
        z = torch.cat([h, tgt, pooled], -1)
        return self.out(self.act2(self.fc2(self.act1(self.fc1(z))))).squeeze(-1)     # logits [B]


# --------------------------------------------------------------------------- workloads

def _params(model: nn.Module) -> tuple[list[torch.Tensor], list[str]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [p for _, p in named], [n for n, _ in named]


def _training(name: str, dtype: str, model: nn.Module, fn: Callable[..., Any], inputs: list[Any], shape: str,
              extra_targets: list[torch.Tensor] | None = None, extra_names: list[str] | None = None) -> Workload:
    model.train()
    params, names = _params(model)
    targets = (extra_targets or []) + params
    return Workload(name, "models", dtype, fn, inputs, mode="fwdbwd",
                    grad_targets=targets, grad_names=(extra_names or []) + names,
                    shape=shape, min_bytes=0, tol=tolerance("models", dtype),
                    notes="dropout 0; attention = matmul + softmax",
                    truth=lambda cots: float64_step(model, fn, inputs, targets, cots))


def float64_step(model: nn.Module, fn: Callable[..., Any], inputs: list[Any], targets: list[torch.Tensor],
                 cotangents: list[torch.Tensor]) -> list[torch.Tensor]:
    """`fn`'s training step in float64: the outputs, then the gradient of every target
    for the given cotangents (as `harness.reference` lists them).  The model's floating
    parameters and buffers (and the float targets) hold float64 copies while it runs and
    their own tensors again after (`.data` swapped: the same Parameter objects, so every
    contender's compiled graph and CUDA-graph addresses are untouched)."""
    swapped = [(t, t.data) for t in {id(t): t for t in [*model.parameters(), *model.buffers(), *targets]}.values()
               if t.is_floating_point()]
    # transformers' MoE experts run as grouped products, which take no float64: its
    # per-expert loop for this run (as tools/model_sweep.py does for its float64 copies)
    cfg = getattr(model, "config", None)
    experts = getattr(cfg, "_experts_implementation", None) if cfg is not None else None
    try:
        if experts is not None:
            cfg._experts_implementation = "eager"
        for t, d in swapped:
            t.data = d.double()
        args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        with torch.enable_grad():
            outs = flat_tensors(fn(*args))
            diff = [o for o in outs if o.requires_grad]
            grads = torch.autograd.grad(diff, targets, [c.double() for c in cotangents], allow_unused=True)
        return [o.detach() for o in outs] + [torch.zeros_like(t) if g is None else g.detach()
                                             for g, t in zip(grads, targets)]
    finally:
        for t, d in swapped:
            t.data = d
        if experts is not None:
            cfg._experts_implementation = experts



def _inference(name: str, dtype: str, model: nn.Module, fn: Callable[..., Any], inputs: list[Any],
               shape: str) -> Workload:
    model.eval()
    return Workload(name, "models", dtype, fn, inputs, shape=shape, min_bytes=0, tol=tolerance("models", dtype),
                    notes="eval mode, no grad; attention = matmul + softmax")


def _bert_config(quick: bool) -> Any:
    import transformers
    size = (dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=128,
                 max_position_embeddings=32) if quick else {})   # {}: BERT-base defaults
    return transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   attn_implementation="eager", **size)


def _gpt2_config(quick: bool) -> Any:
    import transformers
    size = (dict(n_embd=32, n_layer=1, n_head=2, vocab_size=128, n_positions=64) if quick else {})
    vocab = size.get("vocab_size", 50257)
    return transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                                   bos_token_id=vocab - 1, eos_token_id=vocab - 1, attn_implementation="eager",
                                   **size)


def _ids(shape: tuple[int, ...], vocab: int, device: torch.device, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _bert_train(b: int, s: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        import transformers
        cfg = _bert_config(quick)
        torch.manual_seed(1)
        model = transformers.BertForMaskedLM(cfg).to(device=device, dtype=DTYPES[dtype])
        ids, labels = _ids((b, s), cfg.vocab_size, device, 2), _ids((b, s), cfg.vocab_size, device, 3)
        return _training(name, dtype, model, lambda i, l: model(input_ids=i, labels=l).loss, [ids, labels],
                         f"batch {b} x seq {s}, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers")
    return build


def _bert_infer(b: int, s: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        import transformers
        cfg = _bert_config(quick)
        torch.manual_seed(1)
        model = transformers.BertModel(cfg, add_pooling_layer=False).to(device=device, dtype=DTYPES[dtype])
        ids = _ids((b, s), cfg.vocab_size, device, 4)
        return _inference(name, dtype, model, lambda i: model(input_ids=i).last_hidden_state, [ids],
                          f"batch {b} x seq {s}, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers")
    return build


def _gpt2_train(b: int, s: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        import transformers
        cfg = _gpt2_config(quick)
        torch.manual_seed(2)
        model = transformers.GPT2LMHeadModel(cfg).to(device=device, dtype=DTYPES[dtype])
        ids = _ids((b, s), cfg.vocab_size, device, 5)
        return _training(name, dtype, model, lambda i: model(input_ids=i, labels=i).loss, [ids],
                         f"batch {b} x seq {s}, hidden {cfg.n_embd}, {cfg.n_layer} layers")
    return build


# --------------------------------------------------------------------------- issue 18's rows


def _vision_train(arch: str, b: int, px: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    """A torchvision classifier's training step (random init, random labels, cross-entropy
    over 1000 classes): ResNet-50 in channels-last memory format, or Swin-T.  --quick: the
    same families at toy sizes (a one-block-a-stage ResNet, a 16-wide Swin of one block a
    stage with 2 x 2 windows) at 64 px."""
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        from .vision import import_torchvision
        tv = import_torchvision()
        if tv is None:
            raise RuntimeError("torchvision is not installed (make venv puts it in .venv/vision)")
        torch.manual_seed(8)
        classes = 10 if quick else 1000
        if arch == "resnet50":
            model = (tv.models.resnet.ResNet(tv.models.resnet.Bottleneck, [1, 1, 1, 1], num_classes=classes) if quick
                     else tv.models.resnet50(num_classes=classes))
            fmt = torch.channels_last
        else:
            # swin_t's configuration, built directly: the `swin_t` factory fixes stochastic
            # depth at 0.2 and refuses another value ("multiple values for keyword argument")
            model = (tv.models.SwinTransformer([4, 4], 16, [1, 1, 1, 1], [1, 1, 2, 2], [2, 2],
                                               stochastic_depth_prob=0.0, num_classes=classes) if quick
                     else tv.models.SwinTransformer([4, 4], 96, [2, 2, 6, 2], [3, 6, 12, 24], [7, 7],
                                                    stochastic_depth_prob=0.0, num_classes=classes))
            fmt = torch.contiguous_format
        model = model.to(device=device, dtype=DTYPES[dtype], memory_format=fmt)
        gen = torch.Generator().manual_seed(9)
        x = torch.randn((b, 3, px, px), generator=gen).to(device=device, dtype=DTYPES[dtype]).contiguous(
            memory_format=fmt)
        labels = torch.randint(0, classes, (b,), generator=gen).to(device)
        return _training(name, dtype, model, lambda x, y: F.cross_entropy(model(x), y), [x, labels],
                         f"batch {b} x 3 x {px} x {px}" + (", channels_last" if fmt is torch.channels_last else ""))
    return build


def _moe_train(b: int, s: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    """A small Mixtral-style MoE decoder's training step (Hugging Face `transformers`,
    random weights): 4 layers, hidden 512, 8 experts of 1408 with 2 routed a token, GQA
    8/2 heads, vocabulary 32000, with its LM head and loss."""
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        import transformers
        size = (dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, num_local_experts=4, vocab_size=128, max_position_embeddings=64)
                if quick else
                dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, num_local_experts=8, vocab_size=32000, max_position_embeddings=s))
        cfg = transformers.MixtralConfig(num_experts_per_tok=2, attention_dropout=0.0, router_aux_loss_coef=0.0,
                                         attn_implementation="eager", **size)
        torch.manual_seed(10)
        model = transformers.MixtralForCausalLM(cfg).to(device=device, dtype=DTYPES[dtype])
        ids = _ids((b, s), cfg.vocab_size, device, 11)
        return _training(name, dtype, model, lambda i: model(input_ids=i, labels=i).loss, [ids],
                         f"batch {b} x seq {s}, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
                         f"{cfg.num_local_experts} experts (top {cfg.num_experts_per_tok})")
    return build


def _gpt2_decode(past: int, quick: bool) -> Callable[[str, torch.device, str], Workload]:
    def build(dtype: str, device: torch.device, name: str) -> Workload:
        import transformers
        cfg = _gpt2_config(quick)
        torch.manual_seed(2)
        model = transformers.GPT2LMHeadModel(cfg).to(device=device, dtype=DTYPES[dtype])
        head_dim = cfg.n_embd // cfg.n_head
        gen = torch.Generator().manual_seed(6)
        kv = [torch.randn((1, cfg.n_head, past, head_dim), generator=gen).to(device, DTYPES[dtype])
              for _ in range(2 * cfg.n_layer)]
        ids = _ids((1, 1), cfg.vocab_size, device, 7)
        pos = torch.full((1, 1), past, dtype=torch.long, device=device)

        def decode(ids: torch.Tensor, pos: torch.Tensor, *flat_kv: torch.Tensor) -> torch.Tensor:
            # the cache is rebuilt from fixed tensors every call, so each call is the same step
            try:
                cache = transformers.DynamicCache(config=cfg)
            except TypeError:      # older transformers: no config argument
                cache = transformers.DynamicCache()
            for layer in range(cfg.n_layer):
                cache.update(flat_kv[2 * layer], flat_kv[2 * layer + 1], layer)
            return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True).logits
        return _inference(name, dtype, model, decode, [ids, pos, *kv],
                          f"1 token, KV cache of {past}, hidden {cfg.n_embd}, {cfg.n_layer} layers")
    return build


def _llama(b: int, s: int, quick: bool, train: bool) -> Callable[[str, torch.device, str], Workload]:
    hidden, heads, ffn = (64, 4, 128) if quick else (4096, 32, 11008)

    def build(dtype: str, device: torch.device, name: str) -> Workload:
        dt = DTYPES[dtype]
        torch.manual_seed(3)
        block = LlamaBlock(hidden, heads, ffn)
        for lin in (block.q, block.k, block.v, block.o, block.gate, block.up, block.down):
            nn.init.normal_(lin.weight, std=0.02)
        block = block.to(device=device, dtype=dt)
        gen = torch.Generator().manual_seed(9)
        x = torch.randn((b, s, hidden), generator=gen).to(device, dt)
        cos, sin = (t.to(device, dt) for t in rotary_tables(s, hidden // heads))
        mask = torch.full((s, s), float("-inf")).triu(1).to(device, dt)
        shape = f"batch {b} x seq {s}, hidden {hidden}, {heads} heads, ffn {ffn}"
        if train:
            x.requires_grad_(True)
            return _training(name, dtype, block, block, [x, cos, sin, mask], shape, [x], ["x"])
        return _inference(name, dtype, block, block, [x, cos, sin, mask], shape)
    return build


def _llama_model(b: int, s: int, quick: bool, vocab: int | None = None) -> Callable[[str, torch.device, str], Workload]:
    # 8 layers, hidden 1024, 16 query heads over 4 key/value heads (head 64), SwiGLU ffn 2816, vocab 32000
    # (`vocab`: another vocabulary, e.g. LLaMA-3's 128256 for issue 15's loss-memory row)
    size_vocab, hidden, layers, heads, kv, ffn = (128, 64, 2, 4, 2, 128) if quick else (32000, 1024, 8, 16, 4, 2816)
    vocab = vocab or size_vocab

    def build(dtype: str, device: torch.device, name: str) -> Workload:
        torch.manual_seed(5)
        model = LlamaModel(vocab, hidden, layers, heads, kv, ffn, s).to(device=device, dtype=DTYPES[dtype])
        ids, labels = _ids((b, s), vocab, device, 11), _ids((b, s), vocab, device, 12)
        return _training(name, dtype, model, model, [ids, labels],
                         f"batch {b} x seq {s}, hidden {hidden}, {layers} layers, {heads} heads / {kv} kv heads, "
                         f"ffn {ffn}, vocab {vocab}")
    return build


def _dien(b: int, t_len: int, quick: bool, train: bool) -> Callable[[str, torch.device, str], Workload]:
    items, cats, emb, hidden, mlp = (100, 10, 4, 8, (16, 8)) if quick else (100000, 1000, 18, 36, (200, 80))

    def build(dtype: str, device: torch.device, name: str) -> Workload:
        dt = DTYPES[dtype]
        torch.manual_seed(4)
        model = DIENBlock(items, cats, emb, hidden, mlp).to(device=device, dtype=dt)
        gen = torch.Generator().manual_seed(10)
        hist_items = torch.randint(0, items, (b, t_len), generator=gen).to(device)
        hist_cats = torch.randint(0, cats, (b, t_len), generator=gen).to(device)
        tgt_item = torch.randint(0, items, (b,), generator=gen).to(device)
        tgt_cat = torch.randint(0, cats, (b,), generator=gen).to(device)
        # behaviour sequences of different lengths: a prefix mask
        lengths = torch.randint(1, t_len + 1, (b, 1), generator=gen)
        mask = (torch.arange(t_len)[None, :] < lengths).to(device, dt)
        inputs = [hist_items, hist_cats, tgt_item, tgt_cat, mask]
        shape = f"batch {b}, sequence {t_len}, embedding {emb}, hidden {hidden}"
        if train:
            labels = torch.randint(0, 2, (b,), generator=gen).to(device, dt)

            def loss(*args: torch.Tensor) -> torch.Tensor:
                return F.binary_cross_entropy_with_logits(model(*args[:-1]), args[-1])
            return _training(name, dtype, model, loss, inputs + [labels], shape)
        return _inference(name, dtype, model, lambda *a: torch.sigmoid(model(*a)), inputs, shape)
    return build


def cases(quick: bool) -> list[CaseSpec]:
    hf = ("transformers",)
    # batch 16 (was 32): the rows GPU.md's baseline and issue 12's targets are stated for
    bt, bs = (2, 8) if quick else (16, 128)
    bert_infer_batches = (1,) if quick else (1, 16)
    gb, gs = (2, 8) if quick else (8, 512)       # GPT-2 small b8 s512: the issue-12 baseline row
    past = 8 if quick else 512
    lb, ls = (2, 16) if quick else (2, 2048)
    mb, ms = (2, 16) if quick else (4, 1024)     # LLaMA-style 8 layers: the issue-12 baseline row
    db, dt_len = (8, 4) if quick else (2048, 50)
    # issue 15's rows (its targets are stated for them): BERT-base at batch 32, and the
    # LLaMA-style step with LLaMA-3's vocabulary, whose loss memory the chunked linear +
    # cross-entropy must cut 4x.  Families of their own, so `--case bert_train` and the
    # steps of tools/gpu_run.sh that name the other rows do not grow; `--case issue15_*`.
    b32, v_big = (4, 256) if quick else (32, 128256)
    # issue 18's rows: ResNet-50 training (channels_last, b32), Swin-T training, a small MoE
    # decoder's training step; families `issue18_*` (torchvision from `.vision`)
    vb, vpx = (4, 64) if quick else (32, 224)   # (--quick: BatchNorm over 2 x 2 values at 32 px is ill-conditioned)
    eb, es = (2, 16) if quick else (8, 512)
    # (name, family ("": the name without its sizes), builder, modules it needs)
    builders: list[tuple[str, str, Callable[[str, torch.device, str], Workload], tuple[str, ...]]] = [
        (f"bert_train[b{bt},s{bs}]", "", _bert_train(bt, bs, quick), hf),
        *[(f"bert_infer[b{b},s{bs}]", "", _bert_infer(b, bs, quick), hf) for b in bert_infer_batches],
        (f"gpt2_train[b{gb},s{gs}]", "", _gpt2_train(gb, gs, quick), hf),
        (f"gpt2_decode[b1,past{past}]", "", _gpt2_decode(past, quick), hf),
        (f"llama8_train[b{mb},s{ms}]", "", _llama_model(mb, ms, quick), ()),
        (f"llama_block_train[b{lb},s{ls}]", "", _llama(lb, ls, quick, True), ()),
        (f"llama_block_infer[b{lb},s{ls}]", "", _llama(lb, ls, quick, False), ()),
        (f"dien_train[b{db},T{dt_len}]", "", _dien(db, dt_len, quick, True), ()),
        (f"dien_infer[b{db},T{dt_len}]", "", _dien(db, dt_len, quick, False), ()),
        (f"bert_train[b{b32},s{bs}]", "issue15_bert_train", _bert_train(b32, bs, quick), hf),
        (f"bert_infer[b{b32},s{bs}]", "issue15_bert_infer", _bert_infer(b32, bs, quick), hf),
        (f"llama8_train[b{mb},s{ms},V{v_big}]", "issue15_llama8_vocab", _llama_model(mb, ms, quick, v_big), ()),
        (f"resnet50_train[b{vb},{vpx}px,cl]", "issue18_resnet50", _vision_train("resnet50", vb, vpx, quick),
         ("torchvision",)),
        (f"swin_t_train[b{vb},{vpx}px]", "issue18_swin_t", _vision_train("swin_t", vb, vpx, quick), ("torchvision",)),
        (f"moe_train[b{eb},s{es}]", "issue18_moe", _moe_train(eb, es, quick), hf),
    ]
    return [CaseSpec(name, "models", lambda dtype, device, name=name, b=b: b(dtype, device, name), family=fam,
                     requires=req) for name, fam, b, req in builders]
