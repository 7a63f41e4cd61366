"""`genenv ui`: a read-only web view of a lake for data teams (Flask, server-rendered, no JavaScript).

    /                           runs, a task search box, links to the quarantine
    /run?id=<run>[&epoch=<n>]   a run's epochs with their metrics and plots, and its tasks
    /plot?run=<run>&name=<n>    one of report.PLOTS (success, validation, difficulty, selection, calibration, levels), as PNG (drawn from the lake on request)
    /tasks?q=<id>               finds a task by id (or lists ids that start with it)
    /task?id=<id>               the task's lineage: what `genenv audit task` shows
    /checkpoints/<kind>/<v>     a checkpoint's lineage: what `genenv audit checkpoint` shows
    /quarantine                 quarantined records with their reasons
    /evals                      offline benchmark results (genenv eval), newest first

Every page reads the lake when it is requested (the answers of engine/lineage/audit.py) and writes nothing.
Generated text is shown escaped (Jinja's autoescape), never interpreted. Run and task ids are whatever a
producer wrote, so they travel as query parameters (quoted by url_for), never as path segments: an id with
"/", "..", "?" or "#" reaches its page like any other. No lake the ingestor wrote makes a page answer 500
(tests/test_fuzz_ingest.py requests every link of a lake built from fuzzed events).
"""

from __future__ import annotations

import functools
import io

import polars as pl
from flask import Flask, abort, redirect, render_template_string, request, send_file, url_for

from lake import EVAL_RESULTS, QUARANTINE, VALIDATIONS, Lake, quarantine_by_reason, silver
from trainers import CheckpointError

from ..coevolution import CurriculumConfig, recorded_run_config
from .audit import AuditError, audit_checkpoint, audit_task, runs, scan
from .metrics import metrics_from_lake
from .report import PLOTS, draw

LAYOUT = """<!doctype html>
<html><head><meta charset="utf-8"><title>{{ title }} · genenv</title>
<style>
 body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
 table { border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: .9rem; }
 th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; vertical-align: top; }
 th { background: #f3f3f3; } pre { white-space: pre-wrap; max-width: 70rem; background: #fafafa; padding: .5rem; margin: 0; }
 nav a { margin-right: 1rem; } .bad { color: #b00; } .good { color: #070; } img { max-width: 32rem; margin-right: 1rem; }
</style></head>
<body>
<nav><a href="{{ url_for('index') }}">runs</a><a href="{{ url_for('quarantine') }}">quarantine</a><a href="{{ url_for('evals') }}">evals</a>
<form action="{{ url_for('find_task') }}" method="get" style="display:inline">
 <input id="task-search" name="q" placeholder="task id" size="40" value="{{ query or '' }}"> <button id="find" type="submit">find task</button>
</form></nav>
<h1>{{ title }}</h1>
{{ body | safe }}
</body></html>"""

INDEX = """<p>Lake <code>{{ root }}</code>.</p>
<table id="runs"><tr><th>run</th><th>domain</th><th>epochs</th><th>tasks</th><th>valid</th><th>checkpoints</th></tr>
{% for r in runs %}<tr><td><a href="{{ url_for('run_page', id=r.run_id) }}">{{ r.run_id }}</a></td><td>{{ r.domain }}</td>
<td>{{ r.epochs }}</td><td>{{ r.tasks }}</td><td>{{ r.valid }}</td><td>{{ r.checkpoints }}</td></tr>
{% else %}<tr><td colspan="6">no runs yet</td></tr>{% endfor %}</table>"""

RUN = """<h2>Epochs</h2>
<table id="epochs"><tr><th>epoch</th><th>agent v</th><th>env v</th><th>tasks</th><th>valid</th><th>agent success</th>
<th>in band</th><th>validation</th><th>difficulty</th><th>selection bias</th><th>informative / 100</th>
<th>success by level</th></tr>
{% for m in metrics %}<tr><td>{{ m.epoch }}</td><td>{{ m.agent_version }}</td><td>{{ m.env_version }}</td><td>{{ m.tasks }}</td>
<td>{{ '%.2f' % m.valid_share }}</td><td>{{ '%.2f' % m.agent_success }}</td><td>{{ '%.2f' % m.in_band_share }}</td>
<td>{{ m.validation_accuracy }}</td><td>{{ m.difficulty }}</td><td>{{ '%+.2f' % m.selection_bias }}</td>
<td>{{ '%.1f' % m.informative_groups_per_100 }}</td><td>{{ m.success_by_level }}</td></tr>{% endfor %}</table>
{% for name in plots %}<img alt="{{ name }}" src="{{ url_for('plot', run=run_id, name=name) }}">{% endfor %}
<h2>Tasks{% if epoch is not none %} of epoch {{ epoch }}{% endif %} ({{ tasks|length }}{% if truncated %} of {{ total }}{% endif %})</h2>
<p>{% for e in epochs %}<a href="{{ url_for('run_page', id=run_id, epoch=e) }}">epoch {{ e }}</a> {% endfor %}</p>
<table id="tasks"><tr><th>task</th><th>epoch</th><th>valid</th><th>simulator v</th><th>task or invalid reason</th></tr>
{% for t in tasks %}<tr><td><a href="{{ url_for('task_page', id=t.task_id) }}">{{ t.task_id }}</a></td><td>{{ t.epoch }}</td>
<td>{{ t.valid }}</td><td>{{ t.env_model_version }}</td><td>{{ (t.task_prompt or t.invalid_reason or '')[:160] }}</td></tr>{% endfor %}</table>"""

TASK = """{% if t.task is defined and t.task is none %}<p class="bad">Only in the quarantine:</p>{% else %}
<table id="task"><tr><th>run</th><td><a href="{{ url_for('run_page', id=t.run_id) }}">{{ t.run_id }}</a>, epoch {{ t.epoch }}, domain {{ t.domain }}</td></tr>
<tr><th>batch</th><td>{{ t.batch_id }}</td></tr>
<tr><th>simulator version</th><td>{{ t.simulator_version }} ({{ t.producer }})</td></tr>
<tr><th>simulator prompt</th><td><pre>{{ t.simulator_prompt }}</pre></td></tr>
<tr><th>raw generation</th><td><pre>{{ t.raw_generation }}</pre></td></tr>
<tr><th>validation</th><td class="{{ 'good' if t.valid else 'bad' }}">{{ 'valid' if t.valid else 'invalid: ' ~ t.invalid_reason }}</td></tr>
<tr><th>task</th><td><pre>{{ t.task_prompt }}</pre></td></tr>
<tr><th>reference</th><td><pre>{{ t.reference | tojson }}</pre></td></tr>
<tr><th>difficulty</th><td>{{ t.difficulty | tojson }}</td></tr></table>
<h2>Rollouts ({{ t.rollouts|length }})</h2>
<table id="rollouts"><tr><th>rollout</th><th>agent v</th><th>completion</th><th>reward</th><th>success</th><th>checker</th></tr>
{% for r in t.rollouts %}<tr class="rollout"><td>{{ r.rollout_id }}</td><td>{{ r.agent_version }}</td><td>{% if r.turns %}<ol class="turns">{% for u in r.turns %}<li><pre>&gt; {{ u.command }}{% if u.reply and u.reply.strip() != u.command %} (reply: {{ u.reply }}){% endif %}
{{ u.observation }}</pre></li>{% endfor %}</ol>{% else %}<pre>{{ r.completion }}</pre>{% endif %}</td>
<td>{{ r.reward }}</td><td class="{{ 'good' if r.success else 'bad' }}">{{ r.success }}</td><td>{{ r.checker_detail }}</td></tr>{% endfor %}</table>
<h2>Curriculum score</h2>
<table id="batch"><tr><th>group</th><th>granularity</th><th>p_hat</th><th>R_env</th><th>weight</th><th>filtered</th></tr>
{% for b in t.batch %}<tr><td>{{ b.batch_id }}</td><td>{{ b.granularity }}</td><td>{{ '%.3f' % b.p_hat }}</td><td>{{ '%.4f' % b.env_reward }}</td>
<td>{{ '%.4f' % b.weight }}</td><td>{{ b.filtered }}</td></tr>{% else %}<tr><td colspan="6">no curriculum score (no valid rollouts)</td></tr>{% endfor %}</table>
<h2>Pools and checkpoints</h2>
<table id="pools"><tr><th>pool</th><th>first version holding it</th><th>rows</th></tr>
{% for p in t.pools %}<tr><td>{{ p.pool }}</td><td>{{ p.first_version }}</td><td>{{ p.rows }}</td></tr>{% endfor %}</table>
<table id="checkpoints"><tr><th>checkpoint</th><th>epoch</th><th>pool version</th><th>use of this task</th></tr>
{% for c in t.checkpoints %}<tr><td><a href="{{ url_for('checkpoint_page', kind=c.kind, version=c.version) }}">{{ c.kind }} v{{ c.version }}</a></td>
<td>{{ c.epoch }}</td><td>{{ c.pool_table }}@{{ c.pool_version }}</td><td>{{ c.use }}</td></tr>{% endfor %}</table>
{% endif %}
{% if t.quarantined %}<h2>Quarantined records</h2><table><tr><th>topic</th><th>kind</th><th>event</th><th>reason</th></tr>
{% for q in t.quarantined %}<tr><td>{{ q.topic }}</td><td>{{ q.kind }}</td><td>{{ q.event_id }}</td><td>{{ q.reason }}</td></tr>{% endfor %}</table>{% endif %}"""

CHECKPOINT = """<p>Base model <code>{{ c.base_model }}</code>; pool {{ c.pool }}.</p>
<table id="lineage"><tr><th>version</th><th>parent</th><th>run / epoch</th><th>pool version (parent's)</th><th>new rows by epoch</th><th>sha256</th><th>metrics</th></tr>
{% for v in c.lineage %}{% if v.missing %}<tr><td>v{{ v.version }}</td><td colspan="6" class="bad">{{ v.missing }}: the lineage stops here</td></tr>
{% else %}<tr><td>v{{ v.version }}{% if v.warm_start %} (warm start){% endif %}</td><td>v{{ v.parent_version }}</td><td>{{ v.run_id }} / {{ v.epoch }}</td>
<td>{{ v.pool_version }} ({{ v.parent_pool_version }})</td><td>{{ v.new_rows_by_epoch | tojson }}</td><td><code>{{ (v.sha256 or '')[:16] }}</code></td>
<td><pre>{{ v.metrics | tojson }}</pre></td></tr>{% endif %}{% endfor %}</table>"""

QUARANTINE_PAGE = """<table id="reasons"><tr><th>first failed check</th><th>records</th></tr>
{% for reason, n in reasons %}<tr><td>{{ reason }}</td><td>{{ n }}</td></tr>{% else %}<tr><td colspan="2">the quarantine is empty</td></tr>{% endfor %}</table>
<table id="quarantine"><tr><th>topic</th><th>partition/offset</th><th>kind</th><th>event</th><th>task</th><th>reason</th><th>raw (first 200 bytes)</th></tr>
{% for q in rows %}<tr><td>{{ q.topic }}</td><td>{{ q.kafka_partition }}/{{ q.kafka_offset }}</td><td>{{ q.kind }}</td><td>{{ q.event_id }}</td>
<td>{% if q.task_id %}<a href="{{ url_for('task_page', id=q.task_id) }}">{{ q.task_id }}</a>{% endif %}</td><td>{{ q.reason }}</td><td><pre>{{ q.raw }}</pre></td></tr>{% endfor %}</table>"""

EVALS = """<table id="evals"><tr><th>evaluated at</th><th>model</th><th>version</th><th>benchmark</th><th>metric</th><th>value</th><th>items</th><th>scoring</th></tr>
{% for e in rows %}<tr><td>{{ e.evaluated_at }}</td><td>{{ e.model }}</td><td>{{ e.model_version }}</td><td>{{ e.benchmark }}</td>
<td>{{ e.metric }}</td><td>{{ '%.4g' % e.value if e.value is not none else '' }}</td><td>{{ e.items }}</td><td>{{ e.scoring }}</td></tr>
{% else %}<tr><td colspan="8">no evaluations yet (genenv eval)</td></tr>{% endfor %}</table>"""

MAX_ROWS = 1000  # rows a list page shows; the rest is a search away


def create_app(lake: Lake) -> Flask:
    app = Flask("genenv-ui")

    @functools.lru_cache(maxsize=32)
    def metrics_at(run_id: str, refine_version: int):
        """A run's per-epoch metrics as of one refine commit: the run page and its three plots ask for the same."""

        return metrics_from_lake(lake, run_id)

    def run_metrics(run_id: str):
        return metrics_at(run_id, lake.version(VALIDATIONS))  # every lake change is a new refine commit

    def page(title: str, body: str, **context) -> str:
        return render_template_string(
            LAYOUT, title=title, body=render_template_string(body, **context), query=request.args.get("q")
        )

    @app.get("/")
    def index():
        return page("genenv runs", INDEX, runs=runs(lake), root=lake.root)

    def required(name: str) -> str:
        value = request.args.get(name)
        if not value:
            abort(404, f"no {name} given")
        return value

    @app.get("/run")
    def run_page():
        run_id = required("id")
        tasks = scan(lake, silver("task")).filter(pl.col("run_id") == run_id)
        epochs = sorted(tasks.select(pl.col("epoch").unique()).collect()["epoch"].to_list())
        if not epochs:
            abort(404, f"no run {run_id!r} in {lake.root}")
        metrics = run_metrics(run_id)
        epoch = request.args.get("epoch", type=int)
        if epoch is not None:
            tasks = tasks.filter(pl.col("epoch") == epoch)
        total = tasks.select(pl.len()).collect().item()
        shown = tasks.sort(["epoch", "task_id"]).head(MAX_ROWS).collect().to_dicts()
        return page(
            f"run {run_id}",
            RUN,
            run_id=run_id,
            metrics=metrics,
            plots=PLOTS if metrics else (),  # a run with tasks but no scored epoch yet has nothing to draw
            tasks=shown,
            total=total,
            truncated=total > len(shown),
            epochs=epochs,
            epoch=epoch,
        )

    @app.get("/plot")
    def plot():
        run_id, name = required("run"), required("name")
        if name not in PLOTS:
            abort(404, f"no plot {name!r}; plots: {', '.join(PLOTS)}")
        metrics = run_metrics(run_id)
        if not metrics:
            abort(404, f"no run {run_id!r} in {lake.root}")
        try:
            curriculum = recorded_run_config(lake, run_id).curriculum
        except Exception:  # noqa: BLE001 (no config recorded, or an id that names no file: the default band)
            curriculum = CurriculumConfig()
        image = io.BytesIO()
        draw(name, metrics, curriculum, image)
        image.seek(0)
        return send_file(image, mimetype="image/png")

    @app.get("/tasks")
    def find_task():
        query = (request.args.get("q") or "").strip()
        if not query:
            return redirect(url_for("index"))
        ids = (
            scan(lake, silver("task"))
            .filter(pl.col("task_id").str.starts_with(query))
            .select("task_id")
            .head(50)
            .collect()["task_id"]
            .to_list()
        )
        if query in ids:
            return redirect(url_for("task_page", id=query))
        body = (
            "<p>No task has the id <code>{{ q }}</code>.</p>{% if ids %}<p>Ids that start with it:</p><ul>"
            "{% for i in ids %}<li><a href=\"{{ url_for('task_page', id=i) }}\">{{ i }}</a></li>{% endfor %}</ul>{% endif %}"
        )
        return page("task search", body, q=query, ids=ids), 404

    @app.get("/task")
    def task_page():
        task_id = required("id")
        try:
            answer = audit_task(lake, task_id)
        except AuditError as exc:
            return page("unknown task", '<p class="bad">{{ message }}</p>', message=str(exc)), 404
        return page(f"task {task_id}", TASK, t=answer)

    @app.get("/checkpoints/<kind>/<int:version>")
    def checkpoint_page(kind: str, version: int):
        try:
            answer = audit_checkpoint(lake, kind, version)
        except (AuditError, CheckpointError) as exc:
            return page("unknown checkpoint", '<p class="bad">{{ message }}</p>', message=str(exc)), 404
        return page(f"{kind} checkpoint v{version}", CHECKPOINT, c=answer)

    @app.get("/quarantine")
    def quarantine():
        rows = scan(lake, QUARANTINE).sort("kafka_timestamp", descending=True).head(MAX_ROWS).collect()
        shown = [{**r, "raw": (r["raw"] or b"")[:200].decode("utf-8", "replace")} for r in rows.iter_rows(named=True)]
        reasons = quarantine_by_reason(lake).most_common()
        return page("quarantine", QUARANTINE_PAGE, rows=shown, reasons=reasons)

    @app.get("/evals")
    def evals():
        if not lake.exists(EVAL_RESULTS):  # a lake from before the eval tables
            return page("evals", EVALS, rows=[])
        rows = scan(lake, EVAL_RESULTS).sort("evaluated_at", descending=True).head(MAX_ROWS).collect().to_dicts()
        return page("evals", EVALS, rows=rows)

    return app


def serve(lake: Lake, host: str = "127.0.0.1", port: int = 8765) -> None:
    create_app(lake).run(host=host, port=port, threaded=True, use_reloader=False)
