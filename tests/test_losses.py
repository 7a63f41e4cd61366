"""GRPO and RWR objectives against hand-computed values."""

import math

import pytest
import torch

from trainers.losses import GRPOLossConfig, group_advantages, grpo_loss, rwr_loss, rwr_weights

pytestmark = pytest.mark.unit


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.25, unbiased std sqrt(0.25) = 0.5; group 1: all equal -> 0
    adv = group_advantages(rewards, groups, "group")
    torch.testing.assert_close(
        adv,
        torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0]) / torch.tensor([0.5001] * 4 + [1.0, 1.0]),
        atol=1e-4,
        rtol=1e-4,
    )
    torch.testing.assert_close(
        group_advantages(rewards, groups, "none"), torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0])
    )
    batch = group_advantages(rewards, groups, "batch")
    torch.testing.assert_close(batch, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0]) / (rewards.std() + 1e-4))


def test_grpo_loss_on_a_fixed_batch_equals_the_hand_computed_value():
    # two sequences of two tokens; the second sequence's last token is padding
    logps = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.6), 0.0]])
    old = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.4), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0])
    cfg = GRPOLossConfig(loss_type="bnpo", epsilon=0.2)
    loss, metrics = grpo_loss(logps, old, adv, mask, cfg)
    # ratios: 1.0, 0.5, 1.5. token losses: -min(1*1, 1*1) = -1; -min(0.5, 0.8) = -0.5; -min(1.5*-2, 1.2*-2) = 3.0
    assert loss.item() == pytest.approx((-1 - 0.5 + 3.0) / 3)
    assert metrics["clip_ratio"] == pytest.approx(2 / 3)
    grpo, _ = grpo_loss(logps, old, adv, mask, GRPOLossConfig(loss_type="grpo"))
    assert grpo.item() == pytest.approx(((-1 - 0.5) / 2 + 3.0) / 2)
    dr, _ = grpo_loss(logps, old, adv, mask, GRPOLossConfig(loss_type="dr_grpo", max_completion_length=4))
    assert dr.item() == pytest.approx((-1 - 0.5 + 3.0) / (2 * 4))
    high, _ = grpo_loss(logps, old, adv, mask, GRPOLossConfig(loss_type="bnpo", epsilon_high=0.6))
    assert high.item() == pytest.approx((-1 - 0.5 + 3.0) / 3)  # 1.5 < 1.6 is not clipped, but min picks 1.5*-2 anyway


def test_kl_term_uses_the_k3_estimator():
    logps = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, metrics = grpo_loss(
        logps, logps.clone(), torch.tensor([0.0]), torch.ones(1, 1), GRPOLossConfig(beta=0.1), ref
    )
    expected_kl = 0.5 - math.log(0.5) - 1  # exp(d) - d - 1 with d = log(0.25/0.5)
    assert metrics["kl"] == pytest.approx(expected_kl)
    assert loss.item() == pytest.approx(0.1 * expected_kl)


def test_a_group_with_equal_rewards_contributes_no_gradient():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups)
    logits = torch.randn(5, 3, requires_grad=True)
    logps = torch.log_softmax(logits, -1)
    loss, _ = grpo_loss(logps, logps.detach(), adv, torch.ones(5, 3), GRPOLossConfig())
    loss.backward()
    assert torch.all(logits.grad[:3] == 0)
    assert torch.any(logits.grad[3:] != 0)


def test_sequence_level_importance_sampling_shares_one_ratio_per_sequence():
    logps = torch.tensor([[0.0, math.log(0.5)]])
    old = torch.zeros(1, 2)
    loss, metrics = grpo_loss(
        logps,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        GRPOLossConfig(importance_sampling_level="sequence", epsilon=0.5),
    )
    ratio = math.exp(math.log(0.5) / 2)
    assert loss.item() == pytest.approx(-ratio)
    assert metrics["ratio_mean"] == pytest.approx(ratio)


def test_rwr_weights_and_loss_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    weights = rwr_weights(rewards, temperature=0.5, filtered=torch.tensor([False, False, True]))
    e = math.exp(2.0)
    torch.testing.assert_close(weights, torch.tensor([e / (e + 1), 1 / (e + 1), 0.0]))
    logps = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.1), 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    loss, _ = rwr_loss(logps, mask, weights)
    expected = weights[0] * -math.log(0.5) + weights[1] * -math.log(0.1)
    assert loss.item() == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="every row is filtered"):
        rwr_weights(rewards, 1.0, torch.tensor([True, True, True]))
