"""Config loading: defaults, GPT-Neo compatibility, --set overrides, and one-line errors naming the culprit."""

import json

import pytest

from config import ConfigError, describe_keys, from_dict, load_config, model_config_path, parse_override
from tests.common import TINY, run_cli, run_command

GPT_NEO_SMALL = {  # a config written for GPT-Neo itself (its configs/gpt3_small_256.json)
    "n_head": 12, "n_vocab": 50304, "embed_dropout": 0, "lr": 0.0006, "lr_decay": "cosine",
    "warmup_steps": 3000, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "opt_name": "adam", "weight_decay": 0,
    "train_batch_size": 256, "attn_dropout": 0, "train_steps": 572300, "eval_steps": 0, "predict_steps": 1,
    "res_dropout": 0, "eval_batch_size": 64, "predict_batch_size": 1, "iterations": 2500, "n_embd": 768,
    "datasets": [["openwebtext2_new_inputs", None, None, None]], "model_path": "gs://neo-models/GPT3_SMALL",
    "n_ctx": 2048, "n_layer": 12, "scale_by_depth": True, "scale_by_in": False,
    "attention_types": [[["global"], 12]], "mesh_shape": "x:64,y:4",
    "layout": "batch:x,heads:y,vocab:y,intermediate_expanded:y", "activation_function": "gelu",
    "recompute_grad": True, "gradient_clipping": 1.0,
}


def error_of(raw=None, overrides=()):
    with pytest.raises(ConfigError) as info:
        from_dict({**TINY, **(raw or {})}, overrides=tuple(overrides))
    return str(info.value)


def test_defaults_are_documented_and_valid():
    cfg, notes = from_dict({})
    assert notes == []
    assert cfg.attention_layers == ("global",) * cfg.n_layer
    text = describe_keys()
    for key in ("n_embd", "layout", "tokens_per_mb_per_replica", "iterations"):
        assert key in text


def test_gpt_neo_config_loads_and_explains_tpu_keys():
    cfg, notes = from_dict(GPT_NEO_SMALL, source="gpt3_small_256.json")
    assert cfg.n_layer == 12 and cfg.recompute_grad
    explained = " ".join(notes)
    for key in ("iterations", "predict_steps", "predict_batch_size"):
        assert f"'{key}'" in explained


def test_family_defaults_fill_only_what_a_config_leaves_out():
    bert, _ = from_dict({"model": "bert"})
    assert (bert.task, bert.causal, bert.norm_position, bert.layer_norm_epsilon, bert.n_token_types) == (
        "masked_lm", False, "post", 1e-12, 2)
    assert from_dict({"model": "bert", "layer_norm_epsilon": 1e-6})[0].layer_norm_epsilon == 1e-6
    classifier, _ = from_dict({"model": "roberta", "task": "sequence_classification", "num_labels": 3})
    assert (classifier.task, classifier.position_offset, classifier.num_labels) == ("sequence_classification", 2, 3)
    gpt2, _ = from_dict({"model": "gpt2"})
    assert gpt2.qkv_bias and gpt2.attention_scale == "inverse_sqrt_head_dim" and gpt2.task == "causal_lm"
    neo_mlm, _ = from_dict({"mlm_training": True, "causal": False})  # GPT-Neo's own bidirectional MLM
    assert neo_mlm.task == "masked_lm" and neo_mlm.model == "gpt_neo"
    assert from_dict({"scalenorm": True})[0].norm_kind == "scalenorm"
    assert from_dict({"d_ff": 100})[0].intermediate == 100 and from_dict({})[0].intermediate == 4 * 768
    assert "model bert: task=\"masked_lm\"" in describe_keys()


def test_attention_types_expand():
    cfg, _ = from_dict({**TINY, "n_layer": 6, "attention_types": [[["global", "local"], 2], [["local"], 2]]})
    assert cfg.attention_layers == ("global", "local", "global", "local", "local", "local")


@pytest.mark.parametrize("raw, expected", [
    ({"n_embed": 64}, "unknown key 'n_embed'; did you mean 'n_embd'?"),
    ({"save_steps": 500}, "unknown key 'save_steps'; did you mean 'steps_per_checkpoint'?"),  # was 'eval_steps'
    ({"max_steps": 5}, "unknown key 'max_steps'; did you mean 'train_steps'?"),  # was 'max_bad_steps'
    ({"text_key": "sentence"}, "'text_key' is a dataset config's key, not a model config's: set it in the dataset "
                               "config"),  # it suggested weight_decay
    ({"n_layer": "2"}, 'n_layer: expected int, got "2"'),
    ({"lr": -1.0}, "lr: -1.0 is below the minimum 0.0"),
    ({"num_labels": 0}, "num_labels: 0 is below the minimum 1"),
    ({"model": "bert", "task": "token_classification", "num_labels": 1},  # regression is a sequence's score
     "num_labels: 1 is regression (Hugging Face's num_labels 1), which NeoMesh trains for task sequence_classification "
     "only; task token_classification needs 2 or more labels"),
    ({"precision": "fp16"}, 'precision: "fp16" is not one of float32, bfloat16'),
    ({"n_head": 5}, "n_embd: 64 is not divisible by n_head 5"),
    ({"attention_types": [[["global", "local"], 3]]}, "attention_types: expands to 6 layers but n_layer is 2; set "
                                                       'both: attention_types [[["global", "local"], 1]] has 2'),
    ({"n_layer": 3, "attention_types": [[["global", "local"], 1]]}, "attention_types: expands to 2 layers but n_layer "
                                                                    'is 3; set attention_types to list 3 layers too, '
                                                                    'e.g. [[["global"], 3]]'),
    ({"attention_types": [[["globl"], 2]]}, 'attention_types: unknown kind "globl"'),
    ({"attention_types": [["global", 2]]}, "attention_types: entry"),
    ({"res_dropout": 1.5}, "res_dropout: 1.5 is above the maximum 1.0"),
    ({"share_parameters": 1}, "share_parameters: expected bool, got 1"),
    ({"z_loss": -1e-4}, "z_loss: -0.0001 is below the minimum 0.0"),
    ({"z_loss": 1e-4, "entmax_loss": True}, "z_loss: 0.0001 penalises the softmax normaliser, which entmax_loss"),
    ({"model": "bert", "task": "sequence_classification", "entmax_loss": True},
     "entmax_loss: true shapes a language model's vocabulary distribution; task sequence_classification has none"),
    ({"moe_activation": "rleu"}, "moe_activation: \"rleu\" is not one of the known values (did you mean 'relu'?"),
    ({"activation_function": "prelu"}, 'activation_function: "prelu" is one of GPT-Neo\'s activations with learned '
                                        "parameters (aria, prelu, parcsinh, psoftplus, proottanh)"),
    ({"activation_function": "gelu_new"}, 'activation_function: "gelu_new" is Hugging Face\'s name for GELU\'s tanh '
                                          'approximation, which NeoMesh calls "gelu"'),
    ({"activation_fn": "gleu"}, "activation_function: \"gleu\" is not one of the known values (did you mean 'gelu'?"),
    ({"activation_fn": "relu", "activation_function": "gelu"},
     "'activation_fn' \"relu\" contradicts 'activation_function' \"gelu\""),
    ({"eval_tasks": ["lambda"]}, 'eval_tasks: unknown task "lambda" (known: lambada, multiple_choice)'),
    ({"recompute_grad": "dots"}, 'recompute_grad: "dots" is not one of true, false, none, full, dots_saveable'),
    ({"recompute_grad": 1}, "recompute_grad: expected bool | str, got 1"),
    ({"ada_epsilon2": -1.0}, "ada_epsilon2: -1.0 is below the minimum 0.0"),
    ({"predict_max_steps": 0}, "predict_max_steps: 0 is below the minimum 1"),
    ({"moe_params": {"moe_gating": "ntlb"}}, 'moe_params.moe_gating: "ntlb" is not one of top_2, switch'),
    ({"moe_params": {"moe_dropout_rate": 0.1}}, "moe_params.moe_dropout_rate: 0.1: dropout inside the experts is not"),
    ({"moe_params": {"moe_hidden_size": 4096}}, "moe_params.moe_hidden_size: 4096 differs from the experts' width "
                                                "4*n_embd = 256"),
    ({"moe_params": {"moe_use_experts_attention": True}}, "moe_params.moe_use_experts_attention: mesh-tensorflow's"),
    ({"model": "bret"}, "model: unknown family \"bret\"; did you mean 'bert'?"),
    ({"task": "translation"}, 'task: "translation" is not one of causal_lm, masked_lm, sequence_classification, '
                              'token_classification, seq2seq'),
    ({"causal": False}, "causal: false lets causal_lm see the token it predicts"),
    ({"mlm_training": True}, "causal: a masked_lm model must see both sides of a mask"),
    ({"mlm_training": True, "causal": False, "task": "causal_lm"}, "mlm_training: true trains masked_lm"),
    ({"scalenorm": True, "norm": "rmsnorm"}, 'scalenorm: true contradicts norm "rmsnorm"'),
    ({"rezero": True, "norm_position": "post"}, "rezero: true replaces the block norms"),
    ({"axial_pos_emb": [4, 4]}, "axial_pos_emb: 4*4 = 16 positions is fewer than n_ctx 32"),
    ({"n_positions": 16}, "n_positions: a table of 16 positions is shorter than n_ctx 32; give at least n_ctx"),
    ({"axial_pos_emb": [4]}, "axial_pos_emb: [4] is not [A, B]"),
    ({"axial_pos_emb": [4, 8], "rotary_emb": True}, "axial_pos_emb: rotary_emb is on too"),
    ({"norm": "batchnorm"}, 'norm: "batchnorm" is not one of layernorm, rmsnorm, scalenorm'),
    ({"d_ff": 0}, "d_ff: 0 is below the minimum 1"),
    ({"rotary_style": "neox"}, 'rotary_style: "neox" is not one of interleaved, halves'),
    ({"moe_layers": [0, 2]}, "moe_layers: 2 is not a layer index in 0..1"),
    ({"moe_layers": [1, 1]}, "moe_layers: [1, 1] names a layer twice"),
    ({"moe_params": {"num_expert": 4}}, "moe_params: unknown key 'num_expert'; did you mean 'moe_params.num_experts'?"),
    ({"moe_params": {"top_k": 3}}, "moe_params.top_k: 3 is not 1 or 2"),
    ({"moe_params": {"num_experts": 1}}, "moe_params.top_k: 2 is more than num_experts 1"),
    ({"moe_params": {"capacity_factor": 0}}, "moe_params.capacity_factor: 0 must be above 0"),
    ({"moe_params": {"num_experts": "4"}}, 'moe_params.num_experts: expected int, got "4"'),
    ({"moe_params": {"z_loss_weight": -1.0}}, "moe_params.z_loss_weight: -1.0 is below the minimum 0"),
    ({"rotary_emb": True, "rotary_emb_fraction": 0.01}, "rotary_emb_fraction: 0.01 of head_dim 16 rotates no"),
    ({"attention_kernel": "flash"}, 'attention_kernel: "flash" is not one of auto, xla, cudnn'),
    ({"datasets": []}, "datasets: empty"),
    ({"accumulate_unreduced": True}, "accumulate_unreduced: only with gradient accumulation; set "
                                     "tokens_per_mb_per_replica"),
    ({"accumulate_unreduced": True, "tokens_per_mb_per_replica": 64, "moe_layers": [1]},
     "accumulate_unreduced: the mixture-of-experts layers route and balance over the whole batch"),
])
def test_bad_values_name_the_key(raw, expected):
    assert expected in error_of(raw)


def test_new_attention_and_moe_keys_load():
    kinds = [[["global", "none", "none"], 1], [["linear", "local", "none"], 1]]
    cfg, _ = from_dict({**TINY, "n_layer": 6, "attention_types": kinds,
                        "moe_layers": [1, 4], "moe_params": {"num_experts": 4, "top_k": 1}, "num_mem_kv": 2,
                        "rotary_emb": True, "rotary_emb_fraction": 0.25})
    assert cfg.attention_layers == ("global", "none", "none", "linear", "local", "none")
    assert cfg.moe == {"num_experts": 4, "top_k": 1, "capacity_factor": 1.25, "aux_loss_weight": 0.01,
                       "z_loss_weight": 0.001}
    assert cfg.rotary_dim == 4  # a quarter of head_dim 16


def test_set_overrides_parse_json_or_string():
    assert parse_override("lr=0.1") == ("lr", 0.1)
    assert parse_override("mesh_shape=x:4,y:2") == ("mesh_shape", "x:4,y:2")
    assert parse_override('attention_types=[[["local"],2]]') == ("attention_types", [[["local"], 2]])
    cfg, _ = from_dict(TINY, overrides=("n_layer=4", 'attention_types=[[["local"],4]]', "mesh_shape=x:4,y:2",
                                        "precision=bfloat16"))
    assert (cfg.n_layer, cfg.mesh_shape, cfg.precision) == (4, "x:4,y:2", "bfloat16")
    assert "unknown key 'n_layers'" in error_of(overrides=["n_layers=3"])
    assert "expected key=value" in error_of(overrides=["n_layer"])
    # JSON that does not parse is that error, not "expected dict, got" the text; a string key keeps the text
    assert error_of(overrides=['peft={"lora": {"rank": 4}']) == \
        '--set peft={"lora": {"rank": 4}: the value is not valid JSON (Expecting \',\' delimiter at column 21)'
    assert "not valid JSON" in error_of(overrides=['attention_types=[[["local"],2]'])
    assert from_dict(TINY, overrides=("sample_prompt={",))[0].sample_prompt == "{"


def test_load_config_files(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(TINY))
    cfg, _ = load_config(str(path))
    assert cfg.model_path == "runs/mine"
    path.write_text('{"n_layer": 2,\n "n_embd": }')
    with pytest.raises(ConfigError, match=r"mine.json: invalid JSON at line 2"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("raw, message", [
    ({"n_embed": 64}, "typo.json: unknown key 'n_embed'; did you mean 'n_embd'?"),
    ({"moe_params": {"num_expert": 4}},
     "typo.json: moe_params: unknown key 'num_expert'; did you mean 'moe_params.num_experts'?"),
    ({"peft": {"lora": {"rnak": 4}}}, "typo.json: peft.lora: unknown key 'rnak'; did you mean 'peft.lora.rank'?"),
])
def test_an_unknown_key_names_its_file_nested_or_not(tmp_path, raw, message):
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({**TINY, **raw}))
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value) == message


def test_a_bad_value_names_the_file_or_the_set_that_gave_it(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**TINY, "lr_decay": "cosin"}))
    with pytest.raises(ConfigError, match='^mine.json: lr_decay: "cosin" is not one of cosine, linear, none$'):
        load_config(str(path))
    with pytest.raises(ConfigError, match='^--set lr_decay="linar": lr_decay: "linar" is not one of'):
        load_config(str(path), ("lr_decay=linar",))


def test_a_missing_config_suggests_files_that_exist(tmp_path):
    """A suggestion is a file the command would find: the folder's own config by its path, a shipped one by its
    name; the folder's configs are listed apart from the shipped ones."""
    (tmp_path / "mine.json").write_text(json.dumps(TINY))
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "quickstat.json"))
    message = str(info.value)
    assert "did you mean quickstart?" in message and f"in {tmp_path}: mine)" in message, message
    assert "shipped configs: bert_classify" in message and ", mine," not in message, message
    with pytest.raises(ConfigError, match=f"did you mean {tmp_path / 'mine.json'}\\?"):
        load_config(str(tmp_path / "mien.json"))
    with pytest.raises(ConfigError, match="did you mean configs/quickstart.json\\?"):
        load_config("configs/quickstat.json")
    with pytest.raises(ConfigError, match="did you mean quickstart\\?"):  # case aside
        load_config("QUICKSTART")
    with pytest.raises(ConfigError, match="did you mean --model quickstart\\?"):
        model_config_path("QuickStart")
    with pytest.raises(ConfigError,
                       match='^--set mesh_shape=4: mesh_shape: expected str such as "x:4" \\(axis:size\\), got 4$'):
        load_config("quickstart", ("mesh_shape=4",))


def test_a_dataset_config_or_a_hugging_face_config_json_is_named_as_such(tmp_path, monkeypatch):
    """Given as --config, they got 'unknown key 'path'; did you mean 'patch_size'?' and 'unknown key
    'architectures''."""
    with pytest.raises(ConfigError, match=r"^configs/dataset_configs/embedded.json: a dataset config \(it has "
                                          r"'path'\), not a model config; name it in a config's datasets, e.g. "
                                          r"--config quickstart --set 'datasets=\[\[\"configs/dataset_configs/"):
        load_config("configs/dataset_configs/embedded.json")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^gpt2/config.json: a Hugging Face model's config.json, not a NeoMesh "
                                          r"config; give its directory: train.py --init-from gpt2, "):
        load_config("gpt2/config.json")


@pytest.mark.parametrize("overrides, expected", [
    (["bogus=1"], "unknown key 'bogus'"),
    (["mesh_shape=x:3"], "mesh_shape: 'x:3' needs 3 devices but 8 are available"),
    (["mesh_shape=x:4,y:2", "layout=batch:x,heads:x,heads:y"], "dimension 'heads' is given twice"),
    (["layout=batch:x,hedas:x"], "unknown dimension 'hedas'"),
    (["train_batch_size=12"], "train_batch_size: 12 is not divisible by the 8 ways"),
    (["mesh_shape=x:2,y:4", "layout=batch:x,heads:y", "n_head=6", "n_embd=48"],
     "parameter blocks/0/attn/k/kernel dimension 'heads' has size 6, not divisible by mesh axis 'y' of size 4"),
    (["attention_kernel=cudnn"], "attention_kernel: 'cudnn' cannot run here (the platform is cpu, not a CUDA GPU"),
    (["moe_layers=[1]", "moe_params={\"num_experts\": 4}", "layout=batch:x,experts:x"],
     "parameter blocks/1/mlp/b_in dimension 'experts' has size 4, not divisible by mesh axis 'x' of size 8"),
    (['attention_types=[[["linear","none"],2]]', "num_mem_kv=2"],  # silently no effect
     "num_mem_kv: 2, but no layer is global (linear, none); memory key/values join global attention only"),
    (["n_vocab=1001", "layout=batch:x,vocab:x"], "dimension 'vocab' has size 1001, not divisible by mesh axis 'x' of "
     "size 8 (n_vocab 1024, a multiple of 512, splits, as GPT-Neo padded 50257 to 50304; or leave vocab whole)"),
])
def test_cli_errors_are_one_line(tmp_path, overrides, expected):
    """In this process (train.py's main, as the command runs it); the process itself: the test below."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    result = run_command("train.py", "--config", "configs/quickstart.json", "--model-path", str(tmp_path / "run"),
                         "--no-progress", *sets)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_a_bad_key_ends_the_process_with_one_line_and_exit_code_2(tmp_path):
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--model-path", str(tmp_path / "run"),
                     "--set", "n_layr=2", timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and "n_layr" in result.stderr


@pytest.mark.parametrize("override, message", [
    ('peft={"lroa": {}}', "--set peft={\"lroa\": {}}: peft: unknown key 'lroa'"),
    ('peft={"lora": {"rnak": 4}}', "--set peft={\"lora\": {\"rnak\": 4}}: peft.lora: unknown key 'rnak'"),
])
def test_a_nested_error_from_set_names_set(override, message):
    with pytest.raises(ConfigError) as error:
        from_dict({}, overrides=(override,))
    assert str(error.value).startswith(message)
