"""The search over shardings (gp.auto_shard, gp.tactics.auto): pricing, actions, the optimizer."""
