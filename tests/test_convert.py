"""``python -m convert import``: what its closing lines say for each family, and a text model imported from a
directory without tokenizer files (a note at import; predict.py does not read text with another tokenizer)."""

import pytest

from config import from_dict
from convert.__main__ import imported
from tests import hf_fixtures
from tests.common import run_command


@pytest.mark.parametrize("keys, says, not_said", [
    (dict(model="gpt_neo"), ["generate with predict.py", "score with eval.py", "on data made with its tokenizer"], []),
    (dict(model="t5"), ["generate with predict.py"], ["eval.py"]),
    (dict(model="t5", n_decoder_layer=0), ["fine-tune on data made with its tokenizer"], ["predict.py", "eval.py"]),
    (dict(model="bert"), ["fine-tune on data made with its tokenizer"], ["predict.py", "eval.py"]),
    (dict(model="vit"), ["fine-tune with train.py"], ["predict.py", "eval.py", "tokenizer"]),
])
def test_import_says_what_the_family_is_for(keys, says, not_said, tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    lines = imported(from_dict(keys)[0], "org/name", str(tmp_path))
    assert len(lines) == 1
    for text in says + ["--init-from org/name (a new one)", f"python -m convert export {tmp_path} HF_DIR"]:
        assert text in lines[0]
    for text in not_said:
        assert text not in lines[0]


def test_a_text_model_imported_without_a_tokenizer_says_so(tmp_path):
    source, run = tmp_path / "hf", tmp_path / "run"
    hf_fixtures.gpt_neo().save_pretrained(str(source))  # weights and config.json only
    (source / "tokenizer_config.json").write_text("{}")  # settings without a vocabulary are no tokenizer
    result = run_command("-m", "convert", "import", str(source), str(run))
    assert result.returncode == 0, result.stderr[-2000:]
    note, closing = result.stdout.splitlines()
    assert note.startswith(f"note: {source} has no tokenizer") and f"{run}/tokenizer/" in note
    assert closing.startswith("imported gpt_neo") and not (run / "tokenizer").exists()
    # Without the model's tokenizer predict.py refuses, rather than reading text with the default dataset's.
    result = run_command("predict.py", "--model-path", str(run), "--prompt", "x")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert f"tokenizer_path: '{source}'" in result.stderr
