"""run-executor: durable agent runs (state machine, agent loop, checkpoints, ask_human parking)."""
