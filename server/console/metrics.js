/* Engram console: the Prometheus text format and small SVG line charts, no dependencies.
 * Exposes window.EngramMetrics = {parse, derive, fromHistory, lineChart}. */
'use strict';
(function () {
  // parse: the text exposition format (version 0.0.4) into [{name, labels, value}].
  // Comments and malformed lines are skipped; label values are unescaped (\\, \", \n).
  function parse(text) {
    const out = [];
    for (const raw of text.split('\n')) {
      const line = raw.trim();
      if (!line || line[0] === '#') continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$/.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[3]) {
        const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/g;
        let l;
        while ((l = re.exec(m[3])) !== null)
          labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
      }
      let v = m[4];
      const value = v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v);
      out.push({ name: m[1], labels, value });
    }
    return out;
  }

  function sum(samples, name, pred) {
    let s = 0, found = false;
    for (const x of samples)
      if (x.name === name && (!pred || pred(x.labels))) { s += x.value; found = true; }
    return found ? s : null;
  }

  // The request-latency histogram summed over methods: [[le, cumulative count]] by le.
  function buckets(samples) {
    const by = new Map();
    for (const x of samples)
      if (x.name === 'engram_request_duration_seconds_bucket') {
        const le = x.labels.le === '+Inf' ? Infinity : Number(x.labels.le);
        by.set(le, (by.get(le) || 0) + x.value);
      }
    return [...by.entries()].sort((a, b) => a[0] - b[0]);
  }

  // The q-quantile of the requests between two scrapes, interpolated linearly within the
  // bucket as Prometheus's histogram_quantile does; null without requests.
  function quantile(q, prev, cur) {
    const p = new Map(prev);
    const d = cur.map(([le, c]) => [le, c - (p.get(le) || 0)]);
    if (!d.length) return null;
    const total = d[d.length - 1][1];
    if (!(total > 0)) return null;
    const rank = q * total;
    let lo = 0, below = 0;
    for (const [le, c] of d) {
      if (c >= rank) {
        if (le === Infinity) return lo; // beyond the last bound: its lower edge
        return lo + (le - lo) * ((rank - below) / Math.max(c - below, 1e-12));
      }
      lo = le; below = c;
    }
    return lo;
  }

  // derive: one chart point from two consecutive scrapes (a, b: {t (ms), samples}).
  function derive(a, b) {
    const dt = (b.t - a.t) / 1000;
    const reqA = sum(a.samples, 'engram_requests_total');
    const reqB = sum(b.samples, 'engram_requests_total');
    const cntA = sum(a.samples, 'engram_request_duration_seconds_count');
    const cntB = sum(b.samples, 'engram_request_duration_seconds_count');
    const sA = sum(a.samples, 'engram_request_duration_seconds_sum');
    const sB = sum(b.samples, 'engram_request_duration_seconds_sum');
    const errA = sum(a.samples, 'engram_errors_total') || 0;
    const errB = sum(b.samples, 'engram_errors_total') || 0;
    const ba = buckets(a.samples), bb = buckets(b.samples);
    const n = cntB - cntA;
    const ms = (x) => (x === null ? null : x * 1000);
    return {
      t: b.t,
      qps: dt > 0 && reqA !== null && reqB !== null ? Math.max(reqB - reqA, 0) / dt : null,
      eps: dt > 0 ? Math.max(errB - errA, 0) / dt : null,
      p50: ms(quantile(0.5, ba, bb)),
      p99: ms(quantile(0.99, ba, bb)),
      mean: n > 0 ? ((sB - sA) / n) * 1000 : null,
      indexBytes: sum(b.samples, 'engram_index_bytes'),
      budgetBytes: sum(b.samples, 'engram_index_budget_bytes'),
      rssBytes: sum(b.samples, 'engram_process_resident_bytes'),
      vectors: sum(b.samples, 'engram_index_vectors'),
    };
  }

  // fromHistory: the server's last hour (GET /metrics/history) as chart points, each one
  // derived from two consecutive samples as derive does from two scrapes.
  function fromHistory(hist) {
    const snaps = hist.samples.map((x) => ({ t: x.t, samples: [
      { name: 'engram_requests_total', labels: {}, value: x.requests },
      { name: 'engram_errors_total', labels: {}, value: x.errors },
      { name: 'engram_request_duration_seconds_count', labels: {}, value: x.duration_count },
      { name: 'engram_request_duration_seconds_sum', labels: {}, value: x.duration_sum },
      ...x.buckets.map((c, i) => ({ name: 'engram_request_duration_seconds_bucket',
                                    labels: { le: String(hist.le[i]) }, value: c })),
      { name: 'engram_index_bytes', labels: {}, value: x.index_bytes },
      { name: 'engram_index_budget_bytes', labels: {}, value: x.index_budget_bytes },
      { name: 'engram_process_resident_bytes', labels: {}, value: x.resident_bytes },
      { name: 'engram_index_vectors', labels: {}, value: x.index_vectors },
    ] }));
    const out = [];
    for (let i = 1; i < snaps.length; i++) out.push(derive(snaps[i - 1], snaps[i]));
    return out;
  }

  const SVG = 'http://www.w3.org/2000/svg';
  function el(name, attrs) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // lineChart: an <svg> of points [{t, ...}] with one line per series [{key, label,
  // color}]; fmt formats axis values. Missing values break the line.
  function lineChart(points, series, fmt) {
    const W = 560, H = 190, L = 64, R = 10, T = 10, B = 24;
    const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
                            role: 'img' });
    let max = 0;
    for (const p of points) for (const s of series) {
      const v = p[s.key];
      if (v !== null && v !== undefined && isFinite(v)) max = Math.max(max, v);
    }
    max = niceMax(max);
    const t0 = points.length ? points[0].t : 0;
    const t1 = points.length ? points[points.length - 1].t : 1;
    const x = (t) => L + ((t - t0) / Math.max(t1 - t0, 1)) * (W - L - R);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      svg.appendChild(el('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#e3e6ea' }));
      const label = el('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end',
                                 'font-size': 11, fill: '#5f6b7a' });
      label.textContent = fmt(v);
      svg.appendChild(label);
    }
    if (points.length > 1) {
      const span = el('text', { x: W - R, y: H - 6, 'text-anchor': 'end', 'font-size': 11,
                                fill: '#5f6b7a' });
      const secs = Math.round((t1 - t0) / 1000);
      span.textContent = secs >= 120 ? `last ${Math.round(secs / 60)} min` : `last ${secs} s`;
      svg.appendChild(span);
    }
    for (const s of series) {
      let d = '', pen = false;
      for (const p of points) {
        const v = p[s.key];
        if (v === null || v === undefined || !isFinite(v)) { pen = false; continue; }
        d += `${pen ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(v).toFixed(1)} `;
        pen = true;
      }
      if (d) svg.appendChild(el('path', { d, fill: 'none', stroke: s.color,
                                          'stroke-width': 2, 'data-series': s.key }));
    }
    return svg;
  }

  window.EngramMetrics = { parse, derive, fromHistory, lineChart, quantile, buckets };
})();
