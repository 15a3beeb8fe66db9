"""The remedy: turn-level IS and CTN as a loss (SO-PPO / SO-GRPO), and the guard that switches CTN."""
