"""RL: GRPO/DAPO loss, rollout batches, rewards, tasks."""
