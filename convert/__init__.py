"""Weights in and out of NeoMesh runs: one mapping file per source format."""
