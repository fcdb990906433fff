// Small canvas charts for the engine view: no library, nothing fetched.
"use strict";

const Charts = (() => {
  const COLORS = ["#5b8def", "#3fb950", "#d29922", "#f85149", "#a371f7", "#39c5cf"];
  const GRID = "#2a2f3a";
  const TEXT = "#8b93a7";

  // A canvas sized to its CSS box at the screen's pixel ratio; returns [ctx, width, height].
  function prepare(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return [ctx, w, h];
  }

  // A round upper bound and its tick step for values up to `max`.
  function niceScale(max) {
    if (!(max > 0)) return [1, 0.25];
    const raw = max / 4;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    return [Math.ceil(max / step) * step, step];
  }

  function label(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return Number.isInteger(v) ? String(v) : v.toFixed(2).replace(/0+$/, "").replace(/\.$/, "");
  }

  function axes(ctx, w, h, pad, top, step) {
    ctx.strokeStyle = GRID;
    ctx.fillStyle = TEXT;
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let v = 0; v <= top + 1e-9; v += step) {
      const y = h - pad.bottom - (v / top) * (h - pad.top - pad.bottom);
      ctx.beginPath();
      ctx.moveTo(pad.left, Math.round(y) + 0.5);
      ctx.lineTo(w - pad.right, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(label(v), pad.left - 4, y);
    }
  }

  function legend(ctx, w, names, colors) {
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    let x = w - 8;
    for (let i = names.length - 1; i >= 0; i--) {
      x -= ctx.measureText(names[i]).width + 18;
      ctx.fillStyle = colors[i];
      ctx.fillRect(x, 3, 9, 9);
      ctx.fillStyle = TEXT;
      ctx.fillText(names[i], x + 12, 2);
    }
  }

  // Series over wall-clock time: push(t, [v0, v1, ...]) then draw(); `stacked` fills areas.
  class TimeChart {
    constructor(canvas, names, { stacked = false, windowS = 180, colors = COLORS } = {}) {
      this.canvas = canvas;
      this.names = names;
      this.stacked = stacked;
      this.windowS = windowS;
      this.colors = colors;
      this.points = []; // [t (s), [values]]
    }

    push(t, values) {
      this.points.push([t, values]);
      while (this.points.length && this.points[0][0] < t - this.windowS) this.points.shift();
    }

    draw() {
      const [ctx, w, h] = prepare(this.canvas);
      const pad = { left: 40, right: 8, top: 18, bottom: 16 };
      const now = this.points.length ? this.points[this.points.length - 1][0] : 0;
      let max = 0;
      for (const [, vals] of this.points) {
        max = Math.max(max, this.stacked ? vals.reduce((a, b) => a + b, 0) : Math.max(...vals));
      }
      const [top, step] = niceScale(max);
      axes(ctx, w, h, pad, top, step);
      const x = (t) => w - pad.right - ((now - t) / this.windowS) * (w - pad.left - pad.right);
      const y = (v) => h - pad.bottom - (v / top) * (h - pad.top - pad.bottom);
      ctx.fillStyle = TEXT;
      ctx.textAlign = "center";
      ctx.textBaseline = "bottom";
      for (let s = 0; s <= this.windowS; s += 60) ctx.fillText(s ? `-${s}s` : "now", x(now - s), h);
      const base = this.points.map(() => 0);
      this.names.forEach((_, k) => {
        if (this.points.length < 1) return;
        const tops = this.points.map(([, vals], i) => base[i] + vals[k]);
        ctx.beginPath();
        this.points.forEach(([t], i) => (i ? ctx.lineTo(x(t), y(tops[i])) : ctx.moveTo(x(t), y(tops[i]))));
        ctx.strokeStyle = this.colors[k];
        ctx.lineWidth = 1.5;
        ctx.stroke();
        if (this.stacked) {
          for (let i = this.points.length - 1; i >= 0; i--) ctx.lineTo(x(this.points[i][0]), y(base[i]));
          ctx.closePath();
          ctx.globalAlpha = 0.35;
          ctx.fillStyle = this.colors[k];
          ctx.fill();
          ctx.globalAlpha = 1;
          tops.forEach((v, i) => (base[i] = v));
        }
      });
      legend(ctx, w, this.names, this.colors);
    }
  }

  // One stacked bar per step (the newest `maxBars`), e.g. its phase times.
  class StepBars {
    constructor(canvas, names, { maxBars = 120, colors = COLORS, stacked = true } = {}) {
      this.canvas = canvas;
      this.names = names;
      this.maxBars = maxBars;
      this.colors = colors;
      this.stacked = stacked;
    }

    draw(rows) {
      // rows: [[v0, v1, ...] per step], oldest first
      rows = rows.slice(-this.maxBars);
      const [ctx, w, h] = prepare(this.canvas);
      const pad = { left: 40, right: 8, top: 18, bottom: 16 };
      const total = (r) => (this.stacked ? r.reduce((a, b) => a + b, 0) : Math.max(...r));
      const [top, step] = niceScale(Math.max(0, ...rows.map(total)));
      axes(ctx, w, h, pad, top, step);
      const slot = (w - pad.left - pad.right) / this.maxBars;
      const y = (v) => h - pad.bottom - (v / top) * (h - pad.top - pad.bottom);
      rows.forEach((r, i) => {
        const x0 = w - pad.right - (rows.length - i) * slot;
        let acc = 0;
        r.forEach((v, k) => {
          const bw = this.stacked ? Math.max(1, slot - 1) : Math.max(1, (slot - 1) / r.length);
          const bx = this.stacked ? x0 : x0 + k * bw;
          const from = this.stacked ? acc : 0;
          ctx.fillStyle = this.colors[k];
          ctx.fillRect(bx, y(from + v), bw, y(from) - y(from + v));
          if (this.stacked) acc += v;
        });
      });
      ctx.fillStyle = TEXT;
      ctx.textAlign = "left";
      ctx.textBaseline = "bottom";
      ctx.fillText(`last ${rows.length} steps`, pad.left, h);
      legend(ctx, w, this.names, this.colors);
    }
  }

  // Steps on a time axis: each step a bar from its start, split into its phases.
  class Timeline {
    constructor(canvas, phases, { colors = COLORS } = {}) {
      this.canvas = canvas;
      this.phases = phases;
      this.colors = colors;
    }

    draw(steps) {
      const [ctx, w, h] = prepare(this.canvas);
      const pad = { left: 8, right: 8, top: 20, bottom: 16 };
      if (!steps.length) {
        ctx.fillStyle = TEXT;
        ctx.fillText("no steps yet", pad.left, h / 2);
        legend(ctx, w, this.phases, this.colors);
        return;
      }
      const last = steps[steps.length - 1];
      const end = last.start + this.phases.reduce((a, p) => a + last[p + "_ms"], 0) / 1000;
      const begin = steps[0].start;
      const span = Math.max(end - begin, 1e-3);
      const x = (t) => pad.left + ((t - begin) / span) * (w - pad.left - pad.right);
      const barH = h - pad.top - pad.bottom;
      for (const s of steps) {
        let t = s.start;
        this.phases.forEach((p, k) => {
          const d = s[p + "_ms"] / 1000;
          ctx.fillStyle = this.colors[k];
          ctx.fillRect(x(t), pad.top, Math.max(0.5, x(t + d) - x(t)), barH);
          t += d;
        });
      }
      ctx.fillStyle = TEXT;
      ctx.textBaseline = "bottom";
      ctx.textAlign = "left";
      ctx.fillText(`${steps.length} steps over ${(span * 1000).toFixed(0)} ms`, pad.left, h);
      legend(ctx, w, this.phases, this.colors);
    }
  }

  return { TimeChart, StepBars, Timeline, COLORS };
})();
