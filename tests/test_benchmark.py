"""The speed benchmark (fusion_lab/benchmark.py) at tiny sizes: structure of its JSON and
Markdown, parameter counts, fixed-length decoding, configuration discovery and bad input.
Timing values are never asserted on."""

import contextlib
import json
import sys
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch

from fusion_lab import benchmark
from fusion_lab.benchmark import BenchmarkError, build_configs, parse_variant, settings
from fusion_lab.common import cpu_flags, cpu_name, plugin_architectures

from model_building import build_model, count_parameters

DECODE_LEN = 5
VOCAB = 64
TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2",
    "--vocab", str(VOCAB), "--batch-size", "4", "--src-len", "7", "--tgt-len", "6",
    "--decode-len", str(DECODE_LEN), "--decode-batch-size", "3", "--beam", "5",
    "--repeats", "3", "--warmup", "1", "--steps", "1", "--decode-warmup", "0", "--decode-batches", "1",
    "--threads", "1",
]
VARIANTS = {
    "Enc-AVG": "fusion_transformer:--fuse-encoder avg",
    "Dec-SA": "fusion_transformer:--fuse-decoder sa --fusion-hops 2 --fusion-attn-dim 8 --fusion-ffn-dim 12",
}
EXPECTED_CONFIGS = ["vanilla", "mlrf_iwslt_de_en", "Enc-AVG", "Dec-SA"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    json_path, md_path = out / "bench.json", out / "bench.md"
    argv = [*TINY, "--archs", "mlrf_iwslt_de_en", "--json", str(json_path), "--markdown", str(md_path)]
    for name, spec in VARIANTS.items():
        argv += ["--variant", f"{name}={spec}"]
    returned = benchmark.run(argv)
    with open(json_path) as f:
        result = json.load(f)
    return returned, result, md_path.read_text()


@pytest.mark.slow
def test_every_config_reported_in_order(run):
    _, result, _ = run
    assert list(result["configs"]) == EXPECTED_CONFIGS
    assert result["baseline"] == "vanilla"
    assert result["configs"]["vanilla"]["arch"] == "transformer"
    assert result["configs"]["Dec-SA"]["model_args"]["fuse_decoder"] == "sa"
    assert result["configs"]["Dec-SA"]["model_args"]["fusion_hops"] == 2
    assert result["configs"]["Enc-AVG"]["model_args"]["fuse_encoder"] == "avg"
    for row in result["configs"].values():  # matched width reached every model
        assert row["model_args"]["encoder_embed_dim"] == 16 and row["model_args"]["decoder_layers"] == 2
        assert row["skipped_width_flags"] == []


def test_ratio_statistics(run):
    _, result, _ = run
    for name, row in result["configs"].items():
        for measure, absolute in (("train", "tokens_per_s"), ("decode", "sentences_per_s")):
            stats = row[measure]["ratio"]
            assert len(stats["per_repeat"]) == len(row[measure][absolute]) == 3
            assert stats["min"] <= stats["median"] <= stats["max"]
            assert stats["min"] == min(stats["per_repeat"]) and stats["max"] == max(stats["per_repeat"])
            assert all(value > 0 for value in row[measure][absolute])
    vanilla = result["configs"]["vanilla"]
    for measure in ("train", "decode"):
        stats = vanilla[measure]["ratio"]
        assert stats["min"] == stats["median"] == stats["max"] == 1.0
        assert stats["per_repeat"] == [1.0, 1.0, 1.0]


def test_parameter_counts_match_the_models(run):
    _, result, _ = run
    for name, row in result["configs"].items():
        model = build_model(row["arch"], *row["flags"], src_vocab=VOCAB, joined=True)
        assert row["parameters"] == count_parameters(model), name
    # fusion adds parameters on top of the baseline at the same width
    assert result["configs"]["Enc-AVG"]["parameters"] == result["configs"]["vanilla"]["parameters"] + 2 * 16


def test_decoding_runs_the_fixed_number_of_steps(run):
    """Every hypothesis has L tokens + EOS, as the record says: decode() stops the run on any other length."""
    _, result, _ = run
    for name, row in result["configs"].items():
        assert row["decode"]["decoder_steps"] == DECODE_LEN + 1
        assert row["decode"]["hypothesis_lengths"] == [DECODE_LEN + 1], name

    def runner_writing(tokens):
        generator = SimpleNamespace(generate=lambda models, sample: [[{"tokens": torch.ones(tokens)}]])
        return SimpleNamespace(autocast=contextlib.nullcontext, generators={5: generator}, model=None)

    benchmark._Runner.decode(runner_writing(6), {"nsentences": 1}, 5)
    with pytest.raises(ValueError, match=r"min_len = max_len = 5 should give 1 sentences of exactly 6 tokens "
                                         r"\(EOS included\), got 1 with lengths \[4\]"):
        benchmark._Runner.decode(runner_writing(4), {"nsentences": 1}, 5)


def test_memory_and_environment(run):
    _, result, _ = run
    env = result["environment"]
    assert env["device"] == "cpu" and env["dtype"] == "fp32" and env["threads"] == 1
    assert env["torch"] == torch.__version__ and env["fairseq"]
    assert result["memory_method"]
    for row in result["configs"].values():
        memory = row["memory"]
        assert memory["parameter_bytes"] == 4 * row["parameters"]
        assert memory["train_state_bytes"] > memory["parameter_bytes"]  # + Adam moments
        assert memory["train_peak_bytes"] > memory["train_state_bytes"]
        assert memory["decode_peak_bytes"] > memory["parameter_bytes"]


def test_the_cpu_is_named_with_family_model_torch_kernels_and_flags(tmp_path, monkeypatch):
    # two 2-core VMs both named "AMD EPYC" trained one run to losses that part at update 200
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
                       "model name\t: AMD EPYC\nflags\t\t: sse2 avx2 fma\n\nprocessor\t: 1\ncpu family\t: 25\n"
                       "model name\t: other\nflags\t\t: other\n")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cpu_name(str(cpuinfo)) == "AMD EPYC (family 26, model 2; torch AVX512)"
    assert cpu_flags(str(cpuinfo)) == "avx2 fma sse2"  # the first CPU's, sorted
    assert cpu_name(str(tmp_path / "absent")).endswith(" (torch AVX512)")
    assert cpu_flags(str(tmp_path / "absent")) == ""


def test_flop_counts_and_flop_ratios(run):
    _, result, markdown = run
    configs = result["configs"]
    for row in configs.values():
        flops = row["flops"]
        assert flops["train_step"] > 0 and flops["decode_batch"] > 0
        for kind in ("train_step", "decode_batch"):
            assert flops[f"{kind}_ratio"] == pytest.approx(configs["vanilla"]["flops"][kind] / flops[kind])
    assert configs["vanilla"]["flops"]["train_step_ratio"] == 1.0
    # self-attention fusion over the decoder layers adds matrix products to both training and decoding
    assert configs["Dec-SA"]["flops"]["train_step_ratio"] < 1 and configs["Dec-SA"]["flops"]["decode_batch_ratio"] < 1
    assert "Train flop ratio" in markdown and "Decode flop ratio" in markdown


def test_flops_scale_with_the_batch():
    """Matrix-product FLOPs are linear in the number of sentences (fixed lengths): a counter that
    missed the model's products, or counted something else, would not double."""
    def flops(batch):
        argv = [*TINY, "--archs", "--repeats", "1", "--no-memory", "--batch-size", str(batch),
                "--decode-batch-size", str(batch)]
        return benchmark.run(argv)["configs"]["vanilla"]["flops"]

    one, two = flops(2), flops(4)
    assert two["train_step"] == 2 * one["train_step"] and two["decode_batch"] == 2 * one["decode_batch"]


def test_markdown_has_one_row_per_config(run):
    returned, result, markdown = run
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    assert "Train ratio" in header and "Decode ratio" in header
    assert len(body) == len(EXPECTED_CONFIGS)
    for name, line in zip(EXPECTED_CONFIGS, body):
        assert line.startswith(f"| {name}")
    assert returned["configs"].keys() == result["configs"].keys()


def test_default_configs_are_every_plugin_arch():
    archs = plugin_architectures()
    assert {"fusion_transformer", "mlrf_iwslt_de_en", "mlrf_nist_zh_en"} <= set(archs)
    assert "transformer" not in archs
    configs = build_configs()
    assert [c.name for c in configs] == ["vanilla", *archs]
    assert configs[0].baseline and configs[0].arch == "transformer"


def test_discovery_uses_the_model_class_module():
    def model(module):
        return type("M", (), {"__module__": module})

    registry = {
        "ours": model("fusion_fairseq.models.dense"),
        "fairseq": model("fairseq.models.transformer"),
        "lookalike": model("fusion_fairseq_extra.models"),
    }
    assert plugin_architectures(registry) == ["ours"]


def test_width_flags_skip_what_an_arch_does_not_take():
    flags, skipped = benchmark.width_flags("fconv", settings())
    assert flags[flags.index("--encoder-embed-dim") + 1] == "256"
    assert "--encoder-layers" not in flags  # an expression in fconv
    assert any(s.startswith("--encoder-layers") for s in skipped)
    assert any(s.startswith("--encoder-ffn-embed-dim") for s in skipped)


def test_width_flags_of_a_shared_stack():
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = "layerwise_coordination"
    if arch not in ARCH_MODEL_REGISTRY:
        pytest.skip(f"{arch} is not registered")
    flags, skipped = benchmark.width_flags(arch, settings(embed_dim=32, ffn_dim=64, heads=2))
    applied = dict(zip(flags[::2], flags[1::2]))
    assert applied == {"--embed-dim": "32", "--ffn-embed-dim": "64", "--attention-heads": "2", "--dropout": "0.1"}
    assert [s.split(" ")[0] for s in skipped] == ["--encoder-layers", "--decoder-layers"]


def test_variant_spec_parsing():
    config = parse_variant("Both-FNN=fusion_transformer:--fuse-encoder fnn --fuse-decoder fnn")
    assert (config.name, config.arch, config.flags) == (
        "Both-FNN", "fusion_transformer", ["--fuse-encoder", "fnn", "--fuse-decoder", "fnn"])
    assert parse_variant("plain=mlrf_iwslt_de_en").flags == []


@pytest.mark.parametrize("spec,message", [
    ("Enc-FNN", "no '='"),
    ("=fusion_transformer:--fuse-encoder fnn", "empty NAME"),
    ("Enc-FNN=", "empty ARCH"),
    ("Enc-FNN=:--fuse-encoder fnn", "empty ARCH"),
    ("Enc-FNN=fusion_transformerr:--fuse-encoder fnn", "unknown architecture 'fusion_transformerr'"),
    ("Enc-FNN=fusion_transformer:--fuse-encoder 'fnn", "cannot split flags"),
])
def test_malformed_variants(spec, message):
    with pytest.raises(BenchmarkError) as info:
        parse_variant(spec)
    assert message in str(info.value) and repr(spec) in str(info.value)


def test_unknown_arch_lists_the_known_ones():
    with pytest.raises(BenchmarkError) as info:
        build_configs(archs=["nosuch_arch"])
    text = str(info.value)
    assert "unknown architecture 'nosuch_arch'" in text and "--archs" in text
    assert "mlrf_iwslt_de_en" in text and "transformer" in text


def test_duplicate_names():
    with pytest.raises(BenchmarkError, match="duplicate configuration name 'mlrf_iwslt_de_en'"):
        build_configs(archs=["mlrf_iwslt_de_en"], variants=["mlrf_iwslt_de_en=fusion_transformer:"])
    with pytest.raises(BenchmarkError, match="duplicate configuration name 'vanilla'"):
        build_configs(archs=[], variants=["vanilla=transformer"])


def cli_error(capsys, *argv):
    with pytest.raises(SystemExit) as info:
        benchmark.main([*TINY, *argv])
    assert info.value.code == 2
    return capsys.readouterr().err


def test_cli_errors(capsys):
    err = cli_error(capsys, "--archs", "nosuch_arch")
    assert "unknown architecture 'nosuch_arch'" in err and "mlrf_iwslt_de_en" in err
    err = cli_error(capsys, "--variant", "oops")
    assert "malformed --variant 'oops'" in err
    err = cli_error(capsys, "--dtype", "fp16")
    assert "--dtype fp16" in err and "--device cpu" in err
    err = cli_error(capsys, "--dtype", "bf16", "--device", "cpu")
    assert "--dtype bf16" in err and "--device cuda" in err
    err = cli_error(capsys, "--dtype", "fp64")
    assert "--dtype must be one of fp32, fp16, bf16" in err
    err = cli_error(capsys, "--device", "tpu")
    assert "--device must be one of cpu, cuda" in err
    err = cli_error(capsys, "--clock", "process", "--device", "cuda")
    assert "--clock process" in err and "--clock wall" in err
    err = cli_error(capsys, "--clock", "cpu")
    assert "--clock must be one of wall, process" in err
    err = cli_error(capsys, "--steps", "0")
    assert "--steps" in err and "positive integer" in err
    err = cli_error(capsys, "--src-len", "1")
    assert "--src-len must be an integer of at least 2 (the last token is EOS), got '1'" in err


def test_flags_rejected_by_fairseq_name_the_config(capsys):
    err = cli_error(capsys, "--archs", "--variant", "Bad=fusion_transformer:--fuse-encoder bogus")
    assert "configuration 'Bad' (fusion_transformer)" in err and "--fuse-encoder" in err and "bogus" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_unavailable(capsys):
    err = cli_error(capsys, "--device", "cuda")
    assert "--device cuda" in err and "not available" in err


def test_process_clock_baseline_only(capsys):
    result = benchmark.run([*TINY, "--archs", "--clock", "process", "--repeats", "1", "--no-memory"])
    assert list(result["configs"]) == ["vanilla"]
    assert result["settings"]["clock"] == "process" and result["memory_method"] is None
    assert result["configs"]["vanilla"]["memory"] is None
    assert result["configs"]["vanilla"]["flops"]["train_step"] > 0
    assert benchmark.run([*TINY, "--archs", "--repeats", "1", "--no-memory", "--no-flops"])["configs"]["vanilla"]["flops"] is None
    assert result["configs"]["vanilla"]["train"]["ratio"]["per_repeat"] == [1.0]
    assert "process-clock" in capsys.readouterr().out


def test_decoding_step_cost_as_the_source_grows(capsys, tmp_path):
    """--source-lengths: for every configuration and source length, one ms-per-step value per round
    and the speed ratio to the baseline (the baseline's is 1), and a Markdown table with a row per
    length (layer-wise coordination against the Transformer, as He et al. discuss the cost)."""
    out = tmp_path / "sweep.json"
    benchmark.run([*TINY, "--archs", "--repeats", "2", "--source-lengths", "3,9", "--no-memory", "--no-flops",
                    "--variant", "coordination=layerwise_coordination:--layers 3", "--json", str(out)])
    result = json.loads(out.read_text())
    for name, row in result["configs"].items():
        assert sorted(row["step_cost"]) == ["3", "9"]
        for cost in row["step_cost"].values():
            assert len(cost["ms_per_step"]) == 2  # values are timings: not asserted on
    assert result["configs"]["vanilla"]["step_cost"]["9"]["speed_ratio"]["median"] == 1.0
    table = capsys.readouterr().out
    assert "| source tokens | vanilla | coordination |" in table and "\n| 9 | " in table


def test_source_lengths_are_checked(capsys):
    assert "--source-lengths must be integers of at least 2" in cli_error(capsys, "--source-lengths", "1,8")
    assert "--source-lengths must be integers of at least 2 (the last token is EOS) separated by commas, got '8,x'" \
        in cli_error(capsys, "--source-lengths", "8,x")
    assert "--decode-len must be at least 2" in cli_error(capsys, "--source-lengths", "8", "--decode-len", "1")


def test_the_installed_script_exits_0_after_a_run(monkeypatch, capsys):
    """The console script does ``sys.exit(main())``: whatever main returns after a run must mean success."""
    script = entry_points(group="console_scripts")["fusion-fairseq-benchmark"].load()
    monkeypatch.setattr(sys, "argv", ["fusion-fairseq-benchmark", *TINY, "--archs", "--repeats", "1", "--no-memory",
                                      "--no-flops"])
    with pytest.raises(SystemExit) as info:
        sys.exit(script())
    assert info.value.code in (0, None)
    assert "| vanilla (baseline) |" in capsys.readouterr().out


def test_configurations_that_do_not_fit_in_memory_are_refused(monkeypatch, capsys):
    """Every configuration stays built for the whole run: a set that needs more than the machine has free is refused
    in one line naming the estimate and what is available, before any model is built for real."""
    monkeypatch.setattr(benchmark, "available_memory", lambda device: (2**30, "MemAvailable in /proc/meminfo"))
    built = []
    monkeypatch.setattr(benchmark, "_Runner", lambda *args: built.append(args))
    big = ["--embed-dim", "1024", "--ffn-dim", "4096", "--vocab", "32000", "--encoder-layers", "6",
           "--decoder-layers", "6"]
    err = cli_error(capsys, "--archs", "mlrf_iwslt_de_en", *big)
    message = err.strip().splitlines()[-1]
    assert "the 2 configurations need an estimated" in message and "GiB" in message
    assert "more than the 1.0 GiB available (MemAvailable in /proc/meminfo)" in message and "--archs" in message
    assert built == []
    # the estimate: 16 bytes a parameter (weight, gradient, Adam's moments) plus activations
    parameters = sum(benchmark.parameter_count(config, settings(big), benchmark.dictionary_of_size(32000))
                     for config in build_configs(["mlrf_iwslt_de_en"]))
    assert f"({parameters:,} parameters x 16 bytes" in message


def test_the_parameter_count_of_the_memory_estimate_is_the_models():
    config = parse_variant("Enc-AVG=fusion_transformer:--fuse-encoder avg")
    tiny = settings(["--encoder-layers", "2", "--decoder-layers", "2", "--embed-dim", "16", "--ffn-dim", "32",
                     "--heads", "2"])
    flags = benchmark.config_flags(config, tiny)[0]
    model = build_model("fusion_transformer", *flags, src_vocab=VOCAB, joined=True)
    assert benchmark.parameter_count(config, tiny, benchmark.dictionary_of_size(VOCAB)) == count_parameters(model)


@pytest.mark.parametrize("rounds, ranks", [(5, None), (6, (1, 6)), (7, (1, 7)), (8, (1, 8)), (9, (2, 8)),
                                           (11, (2, 10)), (12, (3, 10))])
def test_the_median_interval_is_the_order_statistics_that_cover_95_percent(rounds, ranks):
    values = [10.0 * rank for rank in range(rounds, 0, -1)]  # unsorted on purpose
    interval = benchmark.median_interval(values)
    assert interval == (None if ranks is None else [10.0 * ranks[0], 10.0 * ranks[1]])


def test_the_median_interval_covers_the_median_at_its_level():
    """Its coverage, computed exactly for every round count up to 30: at least 95%, and the next narrower
    pair of order statistics below it."""
    from math import comb

    for n in range(6, 31):
        k = next(k for k in range(1, n + 1) if benchmark.median_interval(list(range(n))) == [k - 1, n - k])
        coverage = lambda k: 1 - 2 * sum(comb(n, i) for i in range(k)) / 2 ** n  # noqa: E731
        assert coverage(k) >= 0.95 > coverage(k + 1)


def test_the_table_gives_the_interval_from_six_rounds_on():
    stats = {"min": 0.8, "median": 0.9, "max": 1.1, "median_ci95": [0.85, 0.95]}
    row = {"baseline": False, "arch": "transformer", "parameters": 1, "memory": None, "flops": None, "step_cost": None,
           "train": {"median_tokens_per_s": 1.0, "ratio": stats},
           "decode": {"median_sentences_per_s": 1.0, "ratio": {**stats, "median_ci95": None}}}
    settings = {key: 1 for key in ("clock", "batch_size", "src_len", "tgt_len", "vocab", "repeats", "steps", "beam",
                                   "decode_batch_size", "decode_len")}
    environment = {"device": "cpu", "device_name": "x", "dtype": "fp32", "threads": 1, "torch": "t", "fairseq": "f"}
    table = benchmark.markdown_table({"environment": environment, "settings": settings, "baseline": "vanilla",
                                      "configs": {"again": row}})
    line = next(line for line in table.splitlines() if line.startswith("| again"))
    assert "| 0.900 [0.850, 0.950] |" in line and "| 0.900 (0.800 - 1.100) |" in line
