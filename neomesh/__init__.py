"""NeoMesh: GPT-Neo rebuilt on JAX and Flax.

The model zoo lives in the repository's top-level packages (``config``, ``models``, ``parallel``, ``training``,
``data``, ``train``, ``predict``). This package holds what an installed NeoMesh needs around them: the console
commands (``cli.py``), where the shipped configs are (``paths.py``), Hugging Face models found by name in the
local cache (``hf_cache.py``) and the help formatter every command line shares (``help.py``).
"""

__version__ = "0.1.0"
