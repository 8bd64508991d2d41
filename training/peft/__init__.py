"""Parameter-efficient fine-tuning on every model of the zoo: LoRA, prefix tuning, adapters, BitFit, and the
trainable filter that freezes the rest (no gradients, no optimizer state).

    from training.peft import apply_peft, trainable_filter
    model = apply_peft(model, {"lora": {"targets": ["q", "v"], "rank": 8}})   # or the config's "peft" key

Modules: lora.py, prefix.py, adapter.py (the parts), apply.py (plugging them in), trainable.py (what trains),
weights.py (adapter-only files, merged export).
"""

from training.peft.apply import apply_peft, build_model  # noqa: F401
from training.peft.trainable import trainable_filter  # noqa: F401
