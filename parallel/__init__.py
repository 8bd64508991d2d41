"""Device mesh, layout rules, sharded initialisation and the jitted train/eval steps."""
