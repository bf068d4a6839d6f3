"""rltune.grpo's trainer math on a real tiny Qwen2 model (torch + transformers; the CPU, and also the
GPU where there is one): the functions a trial runs for its old log-probs and its PPO step
(bench.trainer_memory drives the same ones on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rltune.api.models import ModelSpec  # noqa: E402
from rltune.grpo.loop import micro_batches, old_logprobs, ppo_update, token_logprobs  # noqa: E402
from rltune.grpo.model import build_trainer_model, qwen2_config  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # bench.trainer_memory's GPU run


@pytest.fixture(params=DEVICES)
def dev(request):
    return torch.device(request.param)


@pytest.fixture()
def model(dev):
    torch.manual_seed(0)
    return build_trainer_model(qwen2_config(ModelSpec(preset="tiny-qwen2").resolved(), 64)).to(dev)


def _seqs(n: int, lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(4, 64, (k,), generator=g).tolist() for k in lengths]


def test_a_padded_batch_scores_each_sequence_as_if_alone(model, dev):
    # right padding without an attention mask: causal attention keeps the pads out of real tokens
    seqs = _seqs(1, [30, 7, 19])
    starts = [5, 2, 11]
    with torch.no_grad():
        batch = token_logprobs(model, seqs, starts, dev)
        for s, st, lp in zip(seqs, starts, batch):
            alone = token_logprobs(model, [s], [st], dev)[0]
            assert lp.shape == (len(s) - st,)
            tol = 1e-5 if dev.type == "cpu" else 2e-2  # a GPU computes in bf16 (autocast)
            assert torch.allclose(lp, alone, atol=tol), (lp - alone).abs().max()
            assert bool((lp < 0).all())


def test_a_ppo_step_moves_log_probs_with_the_advantage(model, dev):
    seqs = _seqs(2, [24, 24, 16, 16])
    starts = [8, 8, 4, 4]
    groups = micro_batches([len(s) for s in seqs], 48)
    assert len(groups) > 1  # gradients accumulate over micro-batches
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    old = old_logprobs(model, seqs, starts, groups, dev)
    adv = [1.0, -1.0, 1.0, -1.0]
    clipped = ppo_update(model, opt, seqs, starts, groups, old, adv, dev)
    assert clipped == 0.0  # the first step's ratio is exactly 1
    with torch.no_grad():
        new = token_logprobs(model, seqs, starts, dev)
    moved = [float((n - o).mean()) for n, o in zip(new, old)]
    assert moved[0] > 0 and moved[2] > 0, moved  # positive advantage: more likely
    assert moved[1] < 0 and moved[3] < 0, moved  # negative advantage: less likely
