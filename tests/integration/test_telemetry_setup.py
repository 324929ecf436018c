"""``telemetry.setup`` in a fresh process: nothing exported by default, OTLP only with an
endpoint, the JSON-lines file hook for tests (spans, metric points, log records)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, logging, sys
    from opentelemetry import metrics as metrics_api, trace
    from agentledger import telemetry
    from agentledger.telemetry import metrics, spans

    logging.basicConfig(level=logging.INFO)
    installed = telemetry.setup("agentledger-probe")
    tracer = trace.get_tracer("probe")
    with spans.span(tracer, "probe", attributes={spans.OPERATION_ID: "op-1"}) as probe:
        logging.getLogger("probe").info("event=probe value=%d", 7)
        recording = probe.is_recording()  # before it ends: an ended span records nothing more
        with spans.span(tracer, "child") as child:
            pass
    try:
        with spans.span(tracer, "failing"):
            raise ValueError("a message that must not be exported")
    except ValueError:
        pass
    metrics.dispatch_outcomes.add(1, state="succeeded", connector="crm")
    print(json.dumps({"exporters": installed.exporters,
                      "processors": len(installed.tracer_provider._active_span_processor._span_processors)
                      if installed.tracer_provider else 0,
                      "recording": recording,
                      "meters": type(metrics_api.get_meter_provider()).__name__,
                      "traceparents": [spans.traceparent_of(probe), spans.traceparent_of(child)]}))
    installed.shutdown()
""")


def probe(tmp_path: Path, **env: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "AGENTLEDGER_TELEMETRY_FILE"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    path = env.get("AGENTLEDGER_TELEMETRY_FILE")
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()] if path and Path(path).exists() else []
    return out, lines


def test_nothing_is_exported_by_default(tmp_path: Path) -> None:
    out, _ = probe(tmp_path)
    assert {k: out.pop(k) for k in ("exporters", "processors", "recording", "meters")} == {
        "exporters": [], "processors": 0, "recording": False, "meters": "NoOpMeterProvider"}
    # Nothing is recorded, yet every span still has the W3C context the SDK gives it: a root
    # sampled with a random trace id (03), its child in the same trace with its own span id.
    root, child = (str(tp).split("-") for tp in out["traceparents"])  # type: ignore[union-attr]
    assert root[0] == child[0] == "00" and root[3] == child[3] == "03"
    assert root[1] == child[1] != "0" * 32 and root[2] != child[2]


def test_a_sampler_asked_for_by_name_gets_the_sdk_even_with_nothing_exported(tmp_path: Path) -> None:
    out, _ = probe(tmp_path, OTEL_TRACES_SAMPLER="always_off")
    assert (out["exporters"], out["processors"], out["recording"]) == ([], 0, False)
    # always_off: the SDK's own flags (not sampled), not the unrecorded provider's 03.
    assert [str(tp).rsplit("-", 1)[1] for tp in out["traceparents"]] == ["02", "02"]  # type: ignore[union-attr]


def test_otlp_is_used_only_when_an_endpoint_is_set(tmp_path: Path) -> None:
    out, _ = probe(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_TIMEOUT="1",
                   OTEL_BSP_EXPORT_TIMEOUT="1000", OTEL_METRICS_EXPORTER="none")
    assert (out["exporters"], out["processors"], out["recording"]) == (["otlp-traces"], 1, True)
    # Metrics not exported (OTEL_METRICS_EXPORTER=none): none are aggregated either.
    assert out["meters"] == "NoOpMeterProvider"
    out, _ = probe(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_TIMEOUT="1",
                   OTEL_METRIC_EXPORT_TIMEOUT="1000", OTEL_TRACES_EXPORTER="none")
    assert (out["exporters"], out["processors"], out["meters"]) == (["otlp-metrics"], 0, "MeterProvider")


def test_sdk_disabled_installs_nothing(tmp_path: Path) -> None:
    out, lines = probe(tmp_path, OTEL_SDK_DISABLED="true", AGENTLEDGER_TELEMETRY_FILE=str(tmp_path / "t.jsonl"))
    assert (out["exporters"], out["processors"], lines) == ([], 0, [])
    # No SDK at all: the API's no-op tracer, whose root spans carry no context.
    assert out["recording"] is False and out["traceparents"] == [None, None]


def test_the_file_hook_writes_spans_metric_points_and_logs_as_json_lines(tmp_path: Path) -> None:
    out, lines = probe(tmp_path, AGENTLEDGER_TELEMETRY_FILE=str(tmp_path / "t.jsonl"),
                       OTEL_SERVICE_NAME="renamed")
    assert (out["exporters"], out["recording"], out["meters"]) == (["file"], True, "MeterProvider")
    assert {line["service"] for line in lines} == {"renamed"}
    by_name = {line["name"]: line for line in lines if line["signal"] == "span"}
    assert by_name["probe"]["attributes"] == {"agentledger.operation_id": "op-1"}
    failing = by_name["failing"]
    # A failure is its error type only: no message, no stack trace.
    assert (failing["status"], failing["attributes"], failing["events"]) == ("ERROR", {"error.type": "ValueError"}, [])
    assert "must not be exported" not in json.dumps(lines)
    [log] = [line for line in lines if line["signal"] == "log" and line["logger"] == "probe"]
    assert log["message"] == "event=probe value=7" and log["span_id"] == by_name["probe"]["span_id"]
    points = [line for line in lines if line["signal"] == "metric" and line["name"] == "agentledger.dispatch.outcomes"]
    assert points and points[-1]["attributes"] == {"state": "succeeded", "connector": "crm"}
