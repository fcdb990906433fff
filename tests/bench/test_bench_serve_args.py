"""Bad arguments to `cadence bench serve` get clear messages (and send nothing)."""

from __future__ import annotations

import socket

import pytest

from cadence.cli.main import main


def run(capsys, *flags: str) -> tuple[int, str]:
    try:
        rc = main(["bench", "serve", "--disable-tqdm", *flags])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sweep", "1,x"], "argument --sweep: 'x' is not a positive integer"),
        (["--sweep", "0,4"], "argument --sweep: '0' is not a positive integer"),
        (["--sweep", "4,4"], "repeats a value"),
        (
            ["--sweep", "1,4", "--max-concurrency", "2"],
            "give --sweep or --max-concurrency, not both",
        ),
        (["--max-concurrency", "0"], "argument --max-concurrency: must be positive"),
        (["--num-prompts", "ten"], "argument --num-prompts: 'ten' is not an integer"),
        (["--request-rate", "0"], "argument --request-rate: must be positive"),
        (["--burstiness", "-1"], "argument --burstiness: must be positive"),
        (["--random-range-ratio", "1.5"], "argument --random-range-ratio: must be in [0, 1)"),
        (["--endpoint", "embeddings"], "argument --endpoint: 'embeddings' is not one of"),
        (["--dataset-name", "sharegpt"], "argument --dataset-name: 'sharegpt' is not one of"),
        (["--slo", "ttft=fast"], "argument --slo: bad SLO 'ttft=fast': 'fast' is not a number"),
        (["--slo", "latency=5"], "NAME one of ttft, tpot, e2el"),
        (["--goodput", "ttft:x"], "argument --goodput: bad SLO"),
        (["--slo", "ttft=5", "--goodput", "ttft:5"], "give --slo or --goodput, not both"),
        (["--dataset-name", "jsonl"], "--dataset-name jsonl needs --dataset-path FILE"),
        (["--dataset-name", "jsonl", "--dataset-path", "/no/such.jsonl"], "is not a file"),
        (["--dataset-path", "x.jsonl"], "--dataset-path is for --dataset-name jsonl"),
        (
            [
                "--dataset-name",
                "shared-prefix",
                "--num-prompts",
                "10",
                "--prefix-repetition-num-prefixes",
                "4",
            ],
            "--num-prompts (10) must be a multiple of --prefix-repetition-num-prefixes (4)",
        ),
        (["--base-url", "localhost:8000"], "--base-url must start with http:// or https://"),
        (["--extra-body", "{bad"], "--extra-body is not JSON"),
        (["--extra-body", "[1]"], "--extra-body must be a JSON object"),
        (["--result-dir", "out"], "--result-dir and --result-filename go with --save-result"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--hangup-fraction", "1.5"], "argument --hangup-fraction: must be in [0, 1]"),
        (["--invalid-fraction", "x"], "argument --invalid-fraction: 'x' is not a number"),
        (
            ["--hangup-fraction", "0.6", "--invalid-fraction", "0.5"],
            "--hangup-fraction plus --invalid-fraction must be at most 1",
        ),
        (["--duration", "0"], "argument --duration: must be positive"),
        (["--duration", "10"], "--duration needs --max-concurrency (or --sweep)"),
        (
            ["--duration", "10", "--max-concurrency", "4", "--request-rate", "5"],
            "--duration keeps the concurrency full; it does not go with --request-rate",
        ),
        (["--server-pid", "999999999"], "--server-pid 999999999: no such process"),
        (["--random-images", "1"], "--random-images N (N >= 0) goes with --dataset-name random"),
        (
            ["--random-images", "1", "--endpoint", "chat", "--random-image-size", "4x4000"],
            "--random-image-size must be WxH (8 to 8192 each)",
        ),
    ],
)
def test_bad_arguments(capsys, flags, message):
    rc, err = run(capsys, *flags)
    assert rc == 2
    assert message in err, err


def test_unreachable_server(capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, err = run(capsys, "--base-url", f"http://127.0.0.1:{port}")
    assert rc == 1
    assert f"cadence: error: cannot reach the server at http://127.0.0.1:{port}" in err


def test_help_lists_the_vllm_flags(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--dataset-name", "--random-input-len", "--random-output-len",
                 "--random-range-ratio", "--num-prompts", "--max-concurrency",
                 "--request-rate", "--burstiness", "--save-result", "--sweep", "--slo",
                 "--duration", "--hangup-fraction", "--invalid-fraction", "--server-pid"):  # fmt: skip
        assert flag in out
