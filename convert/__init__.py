"""Weights in and out of NeoMesh: Hugging Face directories (one mapping file per family) and the CLI.

    python -m convert import HF_DIR MODEL_PATH     # a NeoMesh run directory: checkpoint, config.json, tokenizer
    python -m convert export MODEL_PATH HF_DIR     # a directory transformers' from_pretrained loads
"""
