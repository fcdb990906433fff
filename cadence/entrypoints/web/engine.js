// The engine view: polls /v1/engine/stats, /steps and /requests once a second while shown.
// Behind a router (cadence serve -dp N), a picker shows one replica's engine at a time.
"use strict";

(() => {
  const POLL_MS = 1000;
  const PHASES = ["schedule", "prepare", "forward", "sample", "output"];
  const KEEP_STEPS = 400;
  const TIMELINE_S = 2;
  const $ = (id) => document.getElementById(id);
  const fmt = (n, d) => Cadence.fmt(n, d);

  let charts = null;
  let previous = null; // the last stats reading
  let steps = []; // recent step records, oldest first
  let lastStepId = 0;
  let timer = null;
  let replica = null; // behind a router: the index of the replica shown (else null)

  function makeCharts() {
    const C = Charts.COLORS;
    return {
      requests: new Charts.TimeChart($("chart-requests"), ["running", "waiting", "preempted"], {
        colors: [C[1], C[2], C[3]],
      }),
      kv: new Charts.TimeChart($("chart-kv"), ["used", "cached"], { stacked: true, colors: [C[0], C[4]] }),
      tokens: new Charts.TimeChart($("chart-tokens"), ["prompt", "generation"], { colors: [C[2], C[0]] }),
      hits: new Charts.TimeChart($("chart-hits"), ["hit rate"], { colors: [C[4]] }),
      batch: new Charts.StepBars($("chart-batch"), ["decode seqs", "prefill seqs"], { colors: [C[0], C[2]] }),
      split: new Charts.StepBars($("chart-split"), PHASES),
      timeline: new Charts.Timeline($("chart-timeline"), PHASES),
    };
  }

  function setText(id, text) {
    const el = $(id);
    if (el.textContent !== text) el.textContent = text;
  }

  function dl(id, pairs) {
    const box = $(id);
    box.replaceChildren();
    for (const [k, v] of pairs) {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      box.append(dt, dd);
    }
  }

  function showStats(s) {
    const r = s.requests;
    const kv = s.kv_cache;
    const pc = s.prefix_cache;
    const dt = previous ? Math.max(1e-3, s.time - previous.time) : null;
    const rate = (f) => (previous ? (f(s) - f(previous)) / dt : null);
    const genTps = rate((x) => x.tokens.generation);
    const promptTps = rate((x) => x.tokens.prompt);
    const stepsPs = rate((x) => x.num_steps);
    // Hit rate over the last interval when prompts were looked up, else since start.
    const dq = previous ? pc.queried_tokens - previous.prefix_cache.queried_tokens : 0;
    const windowHit = dq > 0 ? (pc.hit_tokens - previous.prefix_cache.hit_tokens) / dq : pc.hit_rate;

    setText("stat-running", fmt(r.running));
    setText("stat-waiting", fmt(r.waiting));
    // Admitted but not in the engine yet (tokenizing, or sent while a step runs): under load
    // this is where new requests are before the engine's counts move.
    const beforeEngine = r.in_flight - r.running - r.waiting;
    setText("stat-waiting-sub", beforeEngine > 0 ? `+${fmt(beforeEngine)} before the engine` : "");
    setText("stat-preempted", fmt(r.preempted));
    setText("stat-preemptions", `${fmt(s.preemptions)} preemptions since start`);
    setText("stat-kv", `${fmt(100 * kv.usage, 1)} %`);
    setText("stat-kv-sub", `${fmt(kv.used_blocks)} used · ${fmt(kv.cached_blocks)} cached · ${fmt(kv.free_blocks)} free`);
    setText("stat-hit-rate", `${fmt(100 * windowHit, 1)} %`);
    setText("stat-hit-sub", `${fmt(100 * pc.hit_rate, 1)} % since start · ${fmt(pc.hit_requests)} requests hit`);
    setText("stat-gen-tps", genTps === null ? "–" : fmt(genTps, 1));
    setText("stat-gen-total", `${fmt(s.tokens.generation)} since start`);
    setText("stat-prompt-tps", promptTps === null ? "–" : fmt(promptTps, 1));
    setText("stat-prompt-total", `${fmt(s.tokens.prompt)} since start`);
    setText("stat-steps", fmt(s.num_steps));
    // The bound on prompt tokens beside decodes now: the static one, or the step pacer's
    // if lower (0: none; core/step_pacer.py).
    const cap = s.scheduler && s.scheduler.prefill_cap;
    const parts = stepsPs === null ? [] : [`${fmt(stepsPs, 1)} steps/s`];
    if (cap) parts.push(`≤ ${fmt(cap)} prompt tokens beside decodes`);
    setText("stat-steps-sub", parts.join(" · "));
    setText("stat-finished", fmt(r.finished));
    setText("stat-rejected", `${fmt(r.rejected)} rejected · ${fmt(r.in_flight)} in flight`);

    const so = s.structured_outputs;
    dl("structured-stats", [
      ["constrained requests", fmt(so.requests)],
      ["grammars compiled", fmt(so.grammar_compiles)],
      ["grammar cache hits", fmt(so.grammar_cache_hits)],
      ["jump-forward tokens", fmt(so.jump_forward_tokens)],
    ]);
    const sd = s.speculative_decoding;
    $("spec-box").hidden = !sd;
    if (sd) {
      dl("spec-stats", [
        ["verifications", fmt(sd.verifications)],
        ["draft tokens", fmt(sd.draft_tokens)],
        ["accepted", fmt(sd.accepted_tokens)],
        ["acceptance rate", `${fmt(100 * sd.acceptance_rate, 1)} %`],
      ]);
    }

    const t = s.time;
    charts.requests.push(t, [r.running, r.waiting - r.preempted, r.preempted]);
    charts.kv.push(t, [kv.used_blocks, kv.cached_blocks]);
    setText("kv-caption", `KV blocks (of ${fmt(kv.num_blocks)}; the rest free)`);
    if (previous) {
      charts.tokens.push(t, [promptTps, genTps]);
      charts.hits.push(t, [100 * windowHit]);
    }
    previous = s;
  }

  function showSteps(answer) {
    for (const step of answer.steps) if (step.id > lastStepId) steps.push(step);
    if (answer.steps.length) lastStepId = steps[steps.length - 1].id;
    if (steps.length > KEEP_STEPS) steps = steps.slice(-KEEP_STEPS);
    charts.batch.draw(steps.map((x) => [x.decode_seqs, x.num_seqs - x.decode_seqs]));
    charts.split.draw(steps.map((x) => PHASES.map((p) => x[p + "_ms"])));
    // The newest 100 steps within the last 2 s of activity (older ones would shrink them).
    const recent = steps.slice(-100);
    const end = recent.length ? recent[recent.length - 1].start : 0;
    charts.timeline.draw(recent.filter((x) => x.start >= end - TIMELINE_S));
    if (answer.capacity === 0) setText("stat-steps-sub", "timeline off (--step-timeline-size 0)");
  }

  function showRequests(answer) {
    setText("requests-total", `(${answer.total})`);
    const body = $("requests-table").querySelector("tbody");
    body.replaceChildren();
    for (const q of answer.requests) {
      const tr = document.createElement("tr");
      const cells = [
        q.id ?? "(hidden: admin key)",
        q.state,
        fmt(q.prompt_tokens),
        fmt(q.output_tokens),
        fmt(q.cached_tokens),
        fmt(q.preemptions),
        `${q.age_s.toFixed(1)} s`,
      ];
      cells.forEach((c, i) => {
        const td = document.createElement("td");
        td.textContent = c;
        if (i === 1) td.className = "state-" + q.state;
        tr.append(td);
      });
      body.append(tr);
    }
  }

  // Behind a router the summed stats name the replicas: then offer them, one at a time.
  function pickReplicas(urls) {
    const pick = document.createElement("select");
    pick.id = "replica-pick";
    pick.title = "the replica whose engine is shown";
    urls.forEach((url, i) => {
      const opt = document.createElement("option");
      opt.value = String(i);
      opt.textContent = `replica ${i} (${url})`;
      pick.appendChild(opt);
    });
    const show = (i) => {
      replica = i;
      shown += 1;
      previous = null; // another engine: its own counters and steps from the start
      steps = [];
      lastStepId = 0;
      charts = makeCharts();
    };
    pick.addEventListener("change", () => {
      show(Number(pick.value));
      poll();
    });
    $("view-engine").prepend(pick);
    show(0);
  }

  // The stats come from the API server's copy (fresh with every engine message): they are
  // read every second, whatever the engine is doing. Steps and requests are answered by the
  // engine between two steps, so during a long step they wait: one such pair of calls at a
  // time, shown when it comes, never holding the stats back.
  let engineCalls = null;
  let shown = 0; // bumped when another replica is picked: late answers of the old one are dropped

  function askEngine(on) {
    if (engineCalls) return;
    const asked = shown;
    engineCalls = Promise.all([
      Cadence.json(`/v1/engine/steps?${on}since=${lastStepId}&limit=${KEEP_STEPS}`),
      Cadence.json(`/v1/engine/requests?${on}limit=100`),
    ])
      .then(([stepAnswer, reqs]) => {
        if (asked !== shown) return;
        showSteps(stepAnswer);
        showRequests(reqs);
      })
      .catch((e) => setText("stat-steps-sub", "⚠ " + e.message))
      .finally(() => {
        engineCalls = null;
      });
  }

  async function poll() {
    const on = replica === null ? "" : `replica=${replica}&`;
    askEngine(on);
    try {
      const stats = await Cadence.json(`/v1/engine/stats?${on}`);
      if (replica === null && stats.replicas) {
        pickReplicas(stats.replicas);
        return; // (the next poll reads replica 0)
      }
      showStats(stats);
      for (const c of [charts.requests, charts.kv, charts.tokens, charts.hits]) c.draw();
    } catch (e) {
      setText("stat-steps-sub", "⚠ " + e.message);
    }
  }

  function active() {
    return $("view-engine").classList.contains("active") && !document.hidden;
  }

  function schedule() {
    clearTimeout(timer);
    if (!active()) return;
    timer = setTimeout(async () => {
      await poll();
      schedule();
    }, POLL_MS);
  }

  async function profile(action) {
    const status = $("profile-status");
    status.textContent = action === "start" ? "starting…" : "stopping and writing the trace…";
    try {
      const answer = await Cadence.json(`/${action}_profile`, { method: "POST" });
      status.textContent = answer.trace ? `trace: ${answer.trace} (${answer.seconds} s)` : "recording…";
    } catch (e) {
      status.textContent = "⚠ " + e.message;
    }
  }

  async function start() {
    if (!charts) charts = makeCharts();
    if (!active()) return;
    await poll();
    schedule();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("profile-start").addEventListener("click", () => profile("start"));
    $("profile-stop").addEventListener("click", () => profile("stop"));
    document.addEventListener("cadence:view", (ev) => ev.detail === "engine" && start());
    document.addEventListener("visibilitychange", () => active() && start());
    start();
  });
})();
