"""Weights in and out of NeoMesh: Hugging Face directories (one mapping file per family) and the CLI, and
GPT-Neo's mesh-tensorflow checkpoints (gpt_neo_mtf.py, its own CLI: python -m convert.gpt_neo_mtf).

    python -m convert import HF_DIR MODEL_PATH     # a NeoMesh run directory: checkpoint, config.json, tokenizer
    python -m convert export MODEL_PATH HF_DIR     # a directory transformers' from_pretrained loads
"""
