/* Engram console: a single-page view of a tenant's memories, sessions and operations.
 *
 * It calls engramd's HTTP API from the same origin: POST /v1/rpc/{method} with the named
 * parameters as a JSON object and "Authorization: Bearer <key>", and GET /metrics. The key
 * is kept in sessionStorage (gone when the tab closes; never in a URL). Memories and
 * transcripts are untrusted text: every piece of data reaches the page through textContent
 * or a text node (h() below), never through innerHTML, and the server's
 * Content-Security-Policy allows no inline script besides.
 */
'use strict';
(function () {
  const STORE = 'engram.console';
  const TYPES = ['fact', 'preference', 'episode', 'strategy_outcome', 'constraint'];
  const SCOPES = ['agent', 'clade', 'tenant'];
  const main = document.getElementById('main');
  let state = load();
  let poller = null; // the operations view's metrics timer
  let renderSeq = 0; // a newer render makes an older one's late answers moot

  // -- state -------------------------------------------------------------------------------
  // {mode: 'tenant' | 'admin', key (the tenant key in use), adminKey, tempKeyId (a key the
  //  console created for an admin, revoked on logout), tenantId, tenantName, tier}
  function load() {
    try { return JSON.parse(sessionStorage.getItem(STORE)) || {}; } catch (e) { return {}; }
  }
  function save() { sessionStorage.setItem(STORE, JSON.stringify(state)); }

  // -- DOM helpers: text only ----------------------------------------------------------------
  // h(tag, attrs, ...children): attrs are properties/attributes (on* are listeners, class,
  // dataset via data-*); children are nodes or values, values become text nodes.
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      const v = attrs[k];
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'class') e.className = v;
      else if (k === 'value') e.value = v;
      else if (k === 'checked') e.checked = !!v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    append(e, children);
    return e;
  }
  function append(e, ...children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }
  function showError(err) {
    const box = document.getElementById('error');
    if (!err) { box.hidden = true; box.textContent = ''; return; }
    box.textContent = err.code ? `${err.code}: ${err.message}` : String(err.message || err);
    box.hidden = false;
  }

  const fmtTime = (ms) => (ms === null || ms === undefined ? '' :
    new Date(ms).toISOString().replace('T', ' ').slice(0, 19));
  const fmtNum = (v, d = 3) => (v === null || v === undefined ? '' :
    (typeof v === 'number' ? Number(v.toFixed(d)).toString() : String(v)));
  function fmtBytes(n) {
    if (n === null || n === undefined) return '';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return `${i ? n.toFixed(1) : n} ${u[i]}`;
  }
  const compact = (v) => (v === null || v === undefined ? '' : JSON.stringify(v));
  const isEmpty = (o) => !o || (typeof o === 'object' && Object.keys(o).length === 0);

  // jsonView: any JSON value as nested lists, every string a text node.
  function jsonView(v) {
    if (v === null || v === undefined) return h('span', { class: 'z' }, 'null');
    if (typeof v === 'string') return h('span', { class: 's' }, JSON.stringify(v));
    if (typeof v === 'number' || typeof v === 'boolean') return h('span', { class: 'n' }, String(v));
    if (Array.isArray(v)) {
      if (!v.length) return h('span', { class: 'z' }, '[]');
      return h('ul', null, v.map((x, i) => h('li', null, h('span', { class: 'k' }, `${i}: `),
                                              jsonView(x))));
    }
    const keys = Object.keys(v);
    if (!keys.length) return h('span', { class: 'z' }, '{}');
    return h('ul', null, keys.map((k) => h('li', null, h('span', { class: 'k' }, `${k}: `),
                                           jsonView(v[k]))));
  }
  // kv: a definition list of [label, value] pairs; empty values are left out
  function kv(pairs) {
    const dl = h('dl', { class: 'kv' });
    for (const [k, v] of pairs)
      if (v !== '' && v !== null && v !== undefined) append(dl, [h('dt', null, k), h('dd', null, v)]);
    return dl;
  }
  // cell: a value of a record for a table cell: times (keys at, *_at) as dates, maps and
  // lists as compact JSON
  function cell(k, v) {
    if (v === null || v === undefined) return '';
    if ((k === 'at' || k.endsWith('_at')) && typeof v === 'number') return fmtTime(v);
    if (typeof v === 'object') return h('span', { class: 'mono' }, compact(v));
    if (typeof v === 'string' && v.includes('\n')) return h('pre', null, v);
    return String(v);
  }
  // autoTable: records as a table whose columns are their keys, in order of appearance
  function autoTable(rows) {
    const cols = [];
    for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
    return h('table', null, h('thead', null, h('tr', null, cols.map((c) => h('th', null, c)))),
      h('tbody', null, rows.map((r) => h('tr', null, cols.map((c) =>
        h('td', null, cell(c, r[c])))))));
  }
  function table(headers, rows) {
    return h('table', null,
      h('thead', null, h('tr', null, headers.map((x) =>
        h('th', { class: x.endsWith('#') ? 'num' : null }, x.replace(/#$/, ''))))),
      h('tbody', null, rows));
  }
  const td = (v, cls) => h('td', { class: cls }, v);
  const tdNum = (v) => h('td', { class: 'num' }, v);
  function link(href, text) { return h('a', { href }, text); }

  // -- the API -------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(code, message, status, fields) {
      super(message); this.code = code; this.status = status; this.fields = fields || {};
    }
  }

  // rpc: one method call through POST /v1/rpc/{method}; the result object, or throws an
  // ApiError with the server's code and message. asAdmin uses the admin key.
  async function rpc(method, params, asAdmin) {
    const key = asAdmin ? state.adminKey : state.key;
    let res;
    try {
      res = await fetch('/v1/rpc/' + encodeURIComponent(method), {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
        body: JSON.stringify(params || {}),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (e) {
      throw new ApiError('unavailable', 'engramd cannot be reached: ' + e.message, 0);
    }
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (body && body.error) {
      const e = body.error;
      throw new ApiError(e.code || 'internal', e.message || 'error', res.status, e);
    }
    if (!res.ok)
      throw new ApiError('internal', `HTTP ${res.status} from /v1/rpc/${method}`, res.status);
    return body;
  }

  // call: rpc for views: an unauthenticated answer (revoked key) returns to the login page.
  async function call(method, params, asAdmin) {
    try {
      return await rpc(method, params, asAdmin);
    } catch (e) {
      if (e.code === 'unauthenticated') { forget(); route(); }
      throw e;
    }
  }

  // -- login and logout ------------------------------------------------------------------------
  // login: a tenant key (egk_...) is checked with tenant.usage; any other key is tried as
  // the admin key first (admin.tenant.list), then as a tenant's.
  async function login(key) {
    const asTenant = async () => {
      state = { key };
      const u = await rpc('tenant.usage', {});
      state = { mode: 'tenant', key, tenantId: u.tenant_id, tenantName: u.name, tier: u.tier };
    };
    try {
      if (key.startsWith('egk_')) {
        await asTenant();
      } else {
        state = { mode: 'admin', adminKey: key };
        try {
          await rpc('admin.tenant.list', { limit: 1 }, true);
        } catch (e) {
          if (e.code !== 'permission_denied') throw e;
          await asTenant();
        }
      }
    } catch (e) {
      state = {};
      throw e;
    }
    save();
  }

  // openTenant: an admin picks a tenant. Admin connections may not call tenant methods, so
  // the console creates a key of the tenant named "console ...", uses it, and revokes it
  // when the admin logs out or picks another tenant.
  async function openTenant(t) {
    await dropTempKey();
    const k = await call('admin.key.create', {
      tenant_id: t.tenant_id, name: 'console ' + new Date().toISOString() }, true);
    Object.assign(state, { key: k.api_key, tempKeyId: k.key_id, tenantId: t.tenant_id,
                           tenantName: t.name, tier: t.tier });
    save();
  }
  async function dropTempKey() {
    if (state.mode !== 'admin' || !state.tempKeyId) return;
    const id = state.tempKeyId;
    Object.assign(state, { key: null, tempKeyId: null, tenantId: null, tenantName: null });
    save();
    try { await rpc('admin.key.revoke', { key_id: id }, true); } catch (e) { /* gone already */ }
  }
  function forget() { state = {}; sessionStorage.removeItem(STORE); }
  async function logout() {
    await dropTempKey();
    forget();
    location.hash = '#/login';
    route();
  }

  function viewLogin() {
    const input = h('input', { type: 'password', id: 'login-key', autocomplete: 'off',
                               placeholder: 'egk_... or the admin key', spellcheck: 'false' });
    const btn = h('button', { type: 'button', id: 'login-submit' }, 'Log in');
    const go = async () => {
      btn.disabled = true;
      try {
        await login(input.value.trim());
        showError(null);
        location.hash = state.mode === 'admin' ? '#/tenants' : '#/memories';
        route();
      } catch (e) {
        showError(e);
        btn.disabled = false;
      }
    };
    btn.addEventListener('click', go);
    input.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') go(); });
    append(main, h('div', { class: 'card login' },
      h('h1', null, 'Log in'),
      h('p', { class: 'muted' }, 'A tenant API key shows that tenant. The admin key lists ' +
        'the tenants to pick from. The key stays in this tab\u2019s session storage until you ' +
        'log out or close the tab.'),
      h('div', { class: 'row' }, h('label', { class: 'field', for: 'login-key' }, 'API key',
                                   input), btn)));
    input.focus();
  }

  // -- memories --------------------------------------------------------------------------------
  const filt = { type: '', agent_id: '', scope: '', min_importance: '', strategy_id: '',
                 tokens: '', attrs: '', include_archived: false, order_by: 'created_at' };

  // filterParams: the shared filter parameters of memory.list and memory.search.
  function filterParams() {
    const p = {};
    if (filt.type) p.type_filter = [filt.type];
    if (filt.agent_id !== '') p.agent_id = Number(filt.agent_id);
    if (filt.scope) p.scopes = [filt.scope];
    if (filt.min_importance !== '') p.min_importance = Number(filt.min_importance);
    if (filt.strategy_id) p.strategy_id = filt.strategy_id;
    const toks = filt.tokens.split(',').map((x) => x.trim()).filter(Boolean);
    if (toks.length) p.tokens = toks;
    if (filt.attrs.trim()) {
      try { p.attrs = JSON.parse(filt.attrs); } catch (e) {
        throw new ApiError('invalid_argument', 'attrs must be a JSON object');
      }
    }
    if (filt.include_archived) p.include_archived = true;
    return p;
  }

  function memoryRow(m, extra) {
    const tr = h('tr', { class: 'link' + (m.archived_at ? ' archived' : ''), 'data-id': m.id,
                         onclick: () => { location.hash = '#/memory/' + m.id; } },
      tdNum(m.id), td(h('span', { class: 'tag' }, m.type)), td(m.scope),
      td(m.agent_id ? m.agent_id : ''), tdNum(fmtNum(m.importance, 2)),
      extra ? extra.map(tdNum) : null,
      td(h('span', { class: 'clip' }, m.content), 'content'),
      td(isEmpty(m.metadata) ? '' : h('span', { class: 'clip mono' }, compact(m.metadata))),
      td(fmtTime(m.created_at)),
      td(m.archived_at ? h('span', { class: 'tag warn' }, m.archived_reason || 'archived') : ''));
    return tr;
  }

  function viewMemories() {
    const seq = renderSeq;
    const field = (label, input) => h('label', { class: 'field' }, label, input);
    const bind = (input, key, ev = 'input') => {
      input.addEventListener(ev, () => {
        filt[key] = input.type === 'checkbox' ? input.checked : input.value;
      });
      return input;
    };
    const sel = (key, opts, id) => bind(h('select', { id }, opts.map(([v, t]) =>
      h('option', { value: v, selected: filt[key] === v ? true : null }, t))), key, 'change');

    const q = h('input', { type: 'search', id: 'search-query', class: 'wide',
                           placeholder: 'search memories by meaning' });
    const mode = h('select', { id: 'search-mode' }, ['vector', 'hybrid', 'text'].map((m) =>
      h('option', { value: m }, m)));
    const topk = h('input', { type: 'number', class: 'num', id: 'search-topk', value: '10',
                              min: '1', max: '1000' });
    // min_similarity: empty sends none; the server leaves out what is below it
    const minSim = h('input', { type: 'number', class: 'num', id: 'search-min-similarity',
                                min: '0', max: '1', step: '0.05', placeholder: 'none' });
    const results = h('div', { id: 'search-results' });
    const doSearch = async () => {
      if (!q.value.trim()) { clear(results); return; }
      try {
        // count_access false: looking at the ranking must not change it
        const p = Object.assign(filterParams(), {
          query: q.value, mode: mode.value, top_k: Number(topk.value) || 10,
          count_access: false });
        if (minSim.value.trim() !== '') p.min_similarity = Number(minSim.value);
        const r = await call('memory.search', p);
        if (seq !== renderSeq) return;
        showError(null);
        clear(results);
        append(results, h('h2', null, `Search: ${r.results.length} results`),
          h('p', { class: 'muted' }, 'Searches here count no access (count_access: false), ' +
            'so looking does not change the ranking. score = ' +
            'w \u00b7 similarity + (1 \u2212 w) \u00b7 composite in vector mode.'),
          table(['id#', 'type', 'scope', 'agent', 'importance#', 'similarity#', 'composite#',
                 'score#', 'content', 'metadata', 'created', 'archived'],
                r.results.map((m) => memoryRow(m, [fmtNum(m.similarity), fmtNum(m.composite),
                                                    fmtNum(m.score, 4)]))));
      } catch (e) { showError(e); }
    };
    q.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') doSearch(); });

    const listBox = h('div', { id: 'memory-list' });
    let cursor = null;
    const more = h('button', { type: 'button', class: 'secondary', id: 'memory-more',
                               hidden: true }, 'Load more');
    const tbody = h('tbody');
    const loadList = async (reset) => {
      try {
        const p = Object.assign(filterParams(), { order_by: filt.order_by, limit: 50 });
        if (!reset && cursor) p.cursor = cursor;
        const r = await call('memory.list', p);
        if (seq !== renderSeq) return;
        showError(null);
        if (reset) clear(tbody);
        append(tbody, r.memories.map((m) => memoryRow(m)));
        cursor = r.next_cursor;
        more.hidden = !cursor;
      } catch (e) { showError(e); }
    };
    more.addEventListener('click', () => loadList(false));
    append(listBox, h('table', null, h('thead', null, h('tr', null,
      ['id', 'type', 'scope', 'agent', 'importance', 'content', 'metadata', 'created',
       'archived'].map((x) => h('th', { class: ['id', 'importance'].includes(x) ? 'num' : null },
                                x)))), tbody), more);

    const apply = h('button', { type: 'button', id: 'filter-apply' }, 'Apply filters');
    apply.addEventListener('click', () => { loadList(true); doSearch(); });
    const sbtn = h('button', { type: 'button', id: 'search-submit' }, 'Search');
    sbtn.addEventListener('click', doSearch);

    append(main,
      h('h1', null, 'Memories'),
      h('div', { class: 'card' },
        h('div', { class: 'row' }, field('Search', q), field('Mode', mode), field('Top k', topk),
          field('Min similarity', minSim), sbtn),
        h('div', { class: 'row' },
          field('Type', sel('type', [['', 'any']].concat(TYPES.map((t) => [t, t])), 'f-type')),
          field('Agent', bind(h('input', { type: 'number', class: 'num', id: 'f-agent',
                                           value: filt.agent_id, min: '0' }), 'agent_id')),
          field('Scope', sel('scope', [['', 'any']].concat(SCOPES.map((t) => [t, t])), 'f-scope')),
          field('Min importance', bind(h('input', { type: 'number', class: 'num', step: '0.05',
            min: '0', max: '1', id: 'f-imp', value: filt.min_importance }), 'min_importance')),
          field('Strategy', bind(h('input', { type: 'text', id: 'f-strategy',
                                              value: filt.strategy_id }), 'strategy_id')),
          field('Tokens (any of)', bind(h('input', { type: 'text', id: 'f-tokens',
            placeholder: 'ETH, USDC', value: filt.tokens }), 'tokens')),
          field('Attrs (JSON containment)', bind(h('input', { type: 'text', id: 'f-attrs',
            placeholder: '{"key": "value"}', value: filt.attrs }), 'attrs')),
          h('label', { class: 'check' }, bind(h('input', { type: 'checkbox', id: 'f-archived',
            checked: filt.include_archived }), 'include_archived', 'change'), 'archived too'),
          field('Order', sel('order_by', [['created_at', 'newest'], ['importance', 'importance'],
                                          ['composite', 'composite']], 'f-order')),
          apply)),
      results,
      h('h2', null, 'All memories'),
      listBox);
    loadList(true);
  }

  async function viewMemory(id) {
    const seq = renderSeq;
    const [g, hist] = await Promise.all([
      call('memory.get', { ids: [id] }),
      call('memory.history', { id }).catch((e) => (e.code === 'not_found' ? null : Promise.reject(e))),
    ]);
    if (seq !== renderSeq) return;
    const m = g.memories[0];
    append(main, h('p', null, link('#/memories', '\u2190 Memories')));
    if (!m) { append(main, h('h1', null, `Memory ${id}`), h('p', null, 'No such memory.')); return; }
    const ref = (x) => (x ? link('#/memory/' + x, `memory ${x}`) : '');
    append(main, h('h1', null, `Memory ${m.id} `, h('span', { class: 'tag' }, m.type),
                   m.archived_at ? h('span', { class: 'tag warn' }, 'archived') : null),
      h('div', { class: 'split' },
        h('div', { class: 'card', id: 'memory-record' },
          h('h2', null, 'Content'), h('pre', { id: 'memory-content' }, m.content),
          h('h2', null, 'Record'),
          kv([['id', m.id], ['type', m.type], ['scope', m.scope],
              ['agent', m.agent_id || ''], ['clade', m.clade_id || ''],
              ['importance', fmtNum(m.importance, 4)], ['pinned', String(!!m.pinned)],
              ['version', m.version], ['created', fmtTime(m.created_at)],
              ['updated', fmtTime(m.updated_at)], ['last accessed', fmtTime(m.last_accessed_at)],
              ['accesses', m.access_count],
              ['cited / injected', `${m.cited_count} / ${m.injected_count}`],
              ['expires', fmtTime(m.expires_at)],
              ['archived', m.archived_at ? `${fmtTime(m.archived_at)} (${m.archived_reason})` : ''],
              ['merged into', ref(m.merged_into)], ['superseded by', ref(m.superseded_by)]]),
          h('h2', null, 'Metadata'), h('div', { class: 'jsonv' }, jsonView(m.metadata))),
        h('div', { class: 'card', id: 'memory-history' },
          h('h2', null, 'History'),
          hist ? historyTimeline(hist.versions) : h('p', { class: 'muted' }, 'No history.'))));
  }

  function historyTimeline(versions) {
    const tags = { update: '', archive: 'warn', restore: 'ok', merge: 'ok', supersede: 'bad' };
    return h('ol', { class: 'timeline' }, versions.map((v) => {
      const ids = (v.detail && (v.detail.merged_ids || v.detail.merged || v.detail.ids)) || null;
      return h('li', { class: v.replaced_by ? null : 'end', 'data-version': v.version },
        h('div', null, h('strong', null, `version ${v.version} `),
          v.replaced_by ? h('span', { class: 'tag ' + (tags[v.replaced_by] || '') },
                            `ended by ${v.replaced_by}`) : h('span', { class: 'tag ok' }, 'current')),
        h('div', { class: 'when' }, `${fmtTime(v.valid_from)} \u2192 ${v.valid_to ? fmtTime(v.valid_to) : 'now'}`),
        h('div', { class: 'muted' }, `${v.type}, importance ${fmtNum(v.importance, 3)}` +
          (v.archived_at ? `, archived ${fmtTime(v.archived_at)}` : '') +
          (v.expires_at ? `, expires ${fmtTime(v.expires_at)}` : '')),
        h('pre', { class: 'version-content' }, v.content),
        isEmpty(v.metadata) ? null : h('div', { class: 'jsonv' }, jsonView(v.metadata)),
        isEmpty(v.detail) ? null : h('div', null, h('span', { class: 'muted' }, 'detail: '),
          Array.isArray(ids) ? ids.map((x) => [ref2(x), ' ']) : null,
          h('span', { class: 'mono' }, compact(v.detail))));
    }));
  }
  const ref2 = (x) => link('#/memory/' + x, `#${x}`);

  // -- sessions --------------------------------------------------------------------------------
  const sfilt = { agent_id: '', state: '' };
  function viewSessions() {
    const seq = renderSeq;
    const agent = h('input', { type: 'number', class: 'num', id: 's-agent', min: '0',
                               value: sfilt.agent_id });
    const st = h('select', { id: 's-state' }, ['', 'active', 'ended', 'completed'].map((s) =>
      h('option', { value: s, selected: sfilt.state === s ? true : null }, s || 'any')));
    const tbody = h('tbody');
    const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load more');
    let cursor = null;
    const load = async (reset) => {
      sfilt.agent_id = agent.value; sfilt.state = st.value;
      const p = { limit: 50 };
      if (agent.value !== '') p.agent_id = Number(agent.value);
      if (st.value) p.state = st.value;
      if (!reset && cursor) p.cursor = cursor;
      try {
        const r = await call('session.list', p);
        if (seq !== renderSeq) return;
        showError(null);
        if (reset) clear(tbody);
        append(tbody, r.sessions.map((s) => h('tr', {
          class: 'link', 'data-id': s.session_id,
          onclick: () => { location.hash = '#/session/' + s.session_id; } },
        tdNum(s.session_id), td(s.agent_id), td(s.parent_id || ''), td(stateTag(s.state)),
        td(s.model), td(s.branch_type || ''), td(fmtTime(s.created_at)),
        td(fmtTime(s.updated_at)), tdNum(fmtNum(s.total_cost_usdc, 6)), tdNum(s.entry_count))));
        cursor = r.next_cursor;
        more.hidden = !cursor;
      } catch (e) { showError(e); }
    };
    more.addEventListener('click', () => load(false));
    const go = h('button', { type: 'button', id: 's-apply' }, 'Apply');
    go.addEventListener('click', () => load(true));
    append(main, h('h1', null, 'Sessions'),
      h('div', { class: 'card row' }, h('label', { class: 'field' }, 'Agent', agent),
        h('label', { class: 'field' }, 'State', st), go),
      h('table', { id: 'session-list' }, h('thead', null, h('tr', null,
        ['session', 'agent', 'parent', 'state', 'model', 'branch', 'created', 'updated',
         'cost (USDC)', 'entries'].map((x) => h('th', null, x)))), tbody), more);
    load(true);
  }
  function stateTag(s) {
    return h('span', { class: 'tag ' + (s === 'active' ? 'ok' : s === 'ended' ? '' : 'warn') }, s);
  }

  const TABS = [['transcript', 'Transcript'], ['scratchpad', 'Scratchpad'], ['notes', 'Notes'],
                ['checkpoints', 'Checkpoints'], ['children', 'Sub-agents'],
                ['work', 'Work items'], ['audit', 'Audit'], ['handoff', 'Handoff']];

  async function viewSession(id, tab) {
    const seq = renderSeq;
    tab = tab || 'transcript';
    const s = await call('session.get', { session_id: id });
    if (seq !== renderSeq) return;
    const pane = h('div', { id: 'session-pane', 'data-tab': tab });
    append(main, h('p', null, link('#/sessions', '\u2190 Sessions')),
      h('h1', null, `Session ${s.session_id} `, stateTag(s.state),
        s.parent_id ? h('span', { class: 'tag' }, 'sub-agent') : null),
      h('div', { class: 'card' }, kv([
        ['agent', s.agent_id], ['model', s.model],
        ['parent', s.parent_id ? link('#/session/' + s.parent_id, `session ${s.parent_id}`) : ''],
        ['resumed from', s.resumed_from ? h('span', null, link('#/session/' +
          s.resumed_from.session_id, `session ${s.resumed_from.session_id}`),
          ` at checkpoint ${s.resumed_from.checkpoint_id}, position ${s.resumed_from.position}`) : ''],
        ['branch', s.branch_type ? `${s.branch_type}${s.simulation ? ' (simulation)' : ''}` : ''],
        ['created / updated', `${fmtTime(s.created_at)} / ${fmtTime(s.updated_at)}`],
        ['ended', fmtTime(s.ended_at)],
        ['cost (USDC)', `${fmtNum(s.total_cost_usdc, 6)} total (own ${fmtNum(s.own_cost_usdc, 6)}, ` +
          `sub-agents ${fmtNum(s.children_cost_usdc, 6)})` +
          (s.max_cost_usdc !== null && s.max_cost_usdc !== undefined ? `, cap ${s.max_cost_usdc}` : '')],
        ['transcript', `${s.entry_count} entries, ${fmtBytes(s.entry_bytes)}, position ${s.position}, ` +
          `${s.compaction_count} compactions, ${s.rounds} rounds`],
        ['notes / checkpoints / sub-agents', `${s.note_count} / ${s.checkpoint_count} / ` +
          `${s.child_count} (${s.active_children} active)`],
        ['memory extraction', s.extraction ? (s.extraction.through_entry_id
          ? `through entry ${s.extraction.through_entry_id}` : 'nothing extracted yet') +
          `, ${s.extraction.pending_messages} messages pending; ${s.extraction.runs} runs: ` +
          `${s.extraction.facts_added} added, ${s.extraction.facts_updated} updated, ` +
          `${s.extraction.facts_unchanged} known` +
          (s.extraction.last_status ? `; last ${fmtTime(s.extraction.last_run_at)} ` +
            `(${s.extraction.last_trigger}): ${s.extraction.last_status}` +
            (s.extraction.last_error ? ` \u2014 ${s.extraction.last_error}` : '') : '') +
          (s.extraction.running ? ' (running)' : '') : ''],
        ['task', s.task ? h('span', { class: 'clip' }, s.task) : ''],
        ['summary', s.summary ? h('span', { class: 'clip' }, s.summary) : ''],
      ])),
      h('nav', { class: 'tabs' }, TABS.map(([k, t]) => h('a', {
        href: `#/session/${id}/${k}`, class: k === tab ? 'active' : null, 'data-tab': k }, t))),
      pane);
    const views = { transcript: tabTranscript, scratchpad: tabScratchpad, notes: tabNotes,
                    checkpoints: tabCheckpoints, children: tabChildren, work: tabWork,
                    audit: tabAudit, handoff: tabHandoff };
    await (views[tab] || tabTranscript)(s, pane, seq);
  }

  // audit records of a session, every page (for the transcript's tombstones), at most 50 pages
  async function allAudit(id) {
    const out = [];
    let cursor = 0;
    for (let i = 0; i < 50; i++) {
      const r = await call('session.audit', { session_id: id, cursor, limit: 1000 });
      out.push(...r.records);
      if (!r.more || !r.records.length) break;
      cursor = r.next_cursor;
    }
    return out;
  }

  function entryView(e) {
    const kind = e.type === 'message' ? e.role : e.type;
    const meta = [`#${e.seq}`, e.type === 'message' ? e.role : e.type, `entry ${e.entry_id}`,
                  e.agent_id !== null && e.agent_id !== undefined ? `agent ${e.agent_id}` : null,
                  fmtTime(e.created_at),
                  e.tokens ? `${e.tokens} tokens` : null,
                  e.cost_usdc ? `${e.cost_usdc} USDC` : null,
                  e.parent_id ? `reply to ${e.parent_id}` : null,
                  e.type === 'summary' ? `compacts ${e.messages_compacted} messages through ` +
                    `entry ${e.through_entry_id}` : null,
                  e.type === 'event' ? `event ${e.event}` : null].filter(Boolean).join(' \u00b7 ');
    return h('div', { class: 'entry ' + kind, 'data-entry': e.entry_id, 'data-seq': e.seq },
      h('div', { class: 'meta' }, meta),
      h('div', { class: 'body' }, e.content),
      e.type === 'event' && !isEmpty(e.data) ? h('div', { class: 'mono muted' }, compact(e.data)) : null);
  }

  async function tabTranscript(s, pane, seq) {
    const list = h('div', { id: 'transcript' });
    const more = h('button', { type: 'button', class: 'secondary', hidden: true,
                               id: 'transcript-more' }, 'Load more');
    const audit = await allAudit(s.session_id);
    const tombs = audit.filter((r) => r.action === 'tombstone' && r.detail)
      .map((r) => ({ seq: r.detail.seq, entry: r.target_id, at: r.at, agent: r.agent_id,
                     tombstone: r.detail.tombstone_id }))
      .sort((a, b) => a.seq - b.seq);
    let shown = 0; // tombstones already placed: each goes before the first later entry
    let cursor = null;
    const place = (upto) => {
      while (shown < tombs.length && tombs[shown].seq < upto) {
        const t = tombs[shown++];
        append(list, h('div', { class: 'entry tombstone', 'data-tombstoned': t.entry },
          `#${t.seq} \u00b7 entry ${t.entry} tombstoned ${fmtTime(t.at)}` +
          (t.agent !== null && t.agent !== undefined ? ` by agent ${t.agent}` : '') +
          ' (hidden from the transcript from then on)'));
      }
    };
    const load = async () => {
      const p = { session_id: s.session_id, include_events: true, limit: 100 };
      if (cursor) p.cursor = cursor;
      const r = await call('session.messages', p);
      if (seq !== renderSeq) return;
      for (const e of r.messages) {
        if (e.type !== 'summary') place(e.seq); // a summary comes first, out of seq order
        append(list, entryView(e));
      }
      cursor = r.next_cursor;
      if (!cursor) place(Infinity);
      more.hidden = !cursor;
    };
    more.addEventListener('click', () => load().catch(showError));
    append(pane, h('p', { class: 'muted' }, 'The transcript as a model is given it: the summary ' +
      'in place stands for what it compacts; events are included; tombstoned entries are ' +
      'marked where they were.'), list, more);
    await load();
  }

  async function tabScratchpad(s, pane) {
    const r = await call('session.scratchpad.get', { session_id: s.session_id });
    append(pane, h('p', { class: 'muted' }, `version ${r.version}, ${r.token_count} tokens, ` +
      `updated ${fmtTime(r.last_updated_at) || 'never'}`),
    h('pre', { id: 'scratchpad' }, r.content || '(empty)'));
  }

  async function tabNotes(s, pane) {
    const r = await call('session.notes', { session_id: s.session_id });
    append(pane, r.notes.length ? table(['note#', 'category', 'scope', 'key', 'value',
      'work item', 'agent', 'created', 'supersedes'], r.notes.map((n) => h('tr', null,
      tdNum(n.note_id), td(h('span', { class: 'tag' }, n.category)), td(n.scope), td(n.key),
      td(h('span', { class: 'clip' }, n.value)), td(n.work_item_id ?? ''), td(n.agent_id ?? ''),
      td(fmtTime(n.created_at)), td(n.supersedes ?? ''))))
      : h('p', { class: 'muted' }, 'No live notes.'));
  }

  async function tabCheckpoints(s, pane) {
    const r = await call('session.checkpoints', { session_id: s.session_id });
    const items = [{ t: s.created_at, title: 'session created', text: `agent ${s.agent_id}, ${s.model}` }]
      .concat(r.checkpoints.map((c) => ({
        t: c.created_at, id: c.checkpoint_id,
        title: `checkpoint ${c.checkpoint_id}` + (c.label ? ` \u201c${c.label}\u201d` : ''),
        text: `position ${c.position}, ${fmtNum(c.total_cost_usdc, 6)} USDC spent, ` +
          `expires ${fmtTime(c.expires_at)}`,
        meta: isEmpty(c.metadata) ? null : c.metadata })));
    if (s.ended_at) items.push({ t: s.ended_at, title: `session ${s.state}`, end: true });
    else items.push({ t: s.updated_at, title: `last activity (${s.state})`, end: true });
    append(pane, h('ol', { class: 'timeline', id: 'checkpoints' }, items.map((it) =>
      h('li', { class: it.end ? 'end' : null, 'data-checkpoint': it.id },
        h('div', { class: 'when' }, fmtTime(it.t)), h('strong', null, it.title),
        it.text ? h('div', null, it.text) : null,
        it.meta ? h('div', { class: 'jsonv' }, jsonView(it.meta)) : null))),
    r.checkpoints.length ? null : h('p', { class: 'muted' }, 'No unexpired checkpoints.'));
  }

  async function tabChildren(s, pane) {
    const r = await call('session.children', { session_id: s.session_id });
    append(pane, r.children.length ? table(['session#', 'agent', 'state', 'model', 'return',
      'task', 'output', 'cost#', 'entries#', 'spawned', 'completed'], r.children.map((c) =>
      h('tr', { class: 'link', 'data-id': c.session_id,
                onclick: () => { location.hash = '#/session/' + c.session_id; } },
        tdNum(c.session_id), td(c.agent_id), td(stateTag(c.state)), td(c.model),
        td(c.return_format), td(h('span', { class: 'clip' }, c.task)),
        td(h('span', { class: 'clip' }, c.output ?? '')), tdNum(fmtNum(c.total_cost_usdc, 6)),
        tdNum(c.entry_count), td(fmtTime(c.created_at)), td(fmtTime(c.completed_at)))))
      : h('p', { class: 'muted' }, 'No sub-agents.'));
  }

  async function tabWork(s, pane) {
    const items = [];
    let cursor = null;
    for (let i = 0; i < 10; i++) {
      const p = { session_id: s.session_id, limit: 1000 };
      if (cursor) p.cursor = cursor;
      const r = await call('session.work_item.list', p);
      items.push(...r.work_items);
      cursor = r.next_cursor;
      if (!cursor) break;
    }
    append(pane, items.length ? table(['item#', 'title', 'status', 'owner', 'version#',
      'created by', 'updated by', 'updated', 'description'], items.map((w) => h('tr', null,
      tdNum(w.work_item_id), td(w.title), td(h('span', { class: 'tag ' +
        ({ done: 'ok', blocked: 'bad', cancelled: 'warn' }[w.status] || '') }, w.status)),
      td(w.owner_agent_id), tdNum(w.version), td(w.created_by), td(w.updated_by),
      td(fmtTime(w.updated_at)), td(h('span', { class: 'clip' }, w.description ?? '')))))
      : h('p', { class: 'muted' }, 'No work items.'));
  }

  async function tabAudit(s, pane, seq) {
    const tbody = h('tbody');
    const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load more');
    let cursor = 0;
    const load = async () => {
      const r = await call('session.audit', { session_id: s.session_id, cursor, limit: 200 });
      if (seq !== renderSeq) return;
      append(tbody, r.records.map((a) => h('tr', null, tdNum(a.seq), td(fmtTime(a.at)),
        td(a.agent_id ?? ''), td(h('span', { class: 'tag' }, a.action)),
        td(a.target_type ? `${a.target_type} ${a.target_id ?? ''}` : ''),
        td(h('span', { class: 'mono' }, compact(a.detail))))));
      cursor = r.next_cursor;
      more.hidden = !r.more;
    };
    more.addEventListener('click', () => load().catch(showError));
    append(pane, h('table', { id: 'audit' }, h('thead', null, h('tr', null,
      ['seq', 'at', 'agent', 'action', 'target', 'detail'].map((x) => h('th', null, x)))), tbody),
    more);
    await load();
  }

  async function tabHandoff(s, pane, seq) {
    const mode = h('select', { id: 'handoff-mode' }, ['continue', 'takeover', 'review',
      'recovery'].map((m) => h('option', { value: m }, m)));
    const out = h('div', { id: 'handoff' });
    const btn = h('button', { type: 'button', id: 'handoff-get' }, 'Build package');
    const go = async () => {
      try {
        const r = await call('session.handoff', { session_id: s.session_id, mode: mode.value });
        if (seq !== renderSeq) return;
        showError(null);
        clear(out);
        const order = ['metrics', 'summary', 'carry_forward', 'blockers', 'work_items',
                       'tasks_done', 'decisions', 'notes', 'checkpoint', 'children',
                       'scratchpad', 'events', 'audit'];
        const head = ['session_id', 'mode', 'state', 'agent_id', 'model', 'generated_at'];
        const rest = Object.keys(r).filter((k) => !order.includes(k) && !head.includes(k));
        const section = (k) => {
          const v = r[k];
          let body;
          if (v === null || v === undefined) body = h('p', { class: 'muted' }, 'none');
          else if (typeof v === 'string') body = h('pre', null, v);
          else if (Array.isArray(v)) body = v.length && typeof v[0] === 'object'
            ? autoTable(v) : h('p', { class: 'muted' }, v.length ? compact(v) : 'none');
          else if (typeof v === 'object') body = kv(Object.keys(v).map((x) => [x, cell(x, v[x])]));
          else body = h('p', null, String(v));
          return h('div', { class: 'card', 'data-section': k }, h('h3', null, k), body);
        };
        append(out, h('h2', null, `Handoff package (${r.mode})`),
          kv(head.map((k) => [k, cell(k, r[k])])),
          order.filter((k) => k in r).map(section), rest.map(section));
      } catch (e) { showError(e); }
    };
    btn.addEventListener('click', go);
    append(pane, h('p', { class: 'muted' }, 'Building a package is recorded in the session\u2019s ' +
      'audit log (action handoff).'), h('div', { class: 'row' },
      h('label', { class: 'field' }, 'Mode', mode), btn), out);
  }

  // -- operations ------------------------------------------------------------------------------
  const scrapes = []; // {t, samples}, the last two kept
  const points = []; // derived chart points, the last hour kept
  let clockSkew = 0; // the server's clock minus this browser's, from /metrics/history

  function usageRow(label, used, limit, extra) {
    const frac = limit ? Math.min(used / limit, 1) : 0;
    const bar = h('div', { class: 'bar' + (frac > 0.9 ? ' high' : '') }, h('span'));
    bar.firstChild.style.width = `${(frac * 100).toFixed(1)}%`;
    return [h('span', null, label), h('span', { class: 'mono' },
      `${used}${limit ? ` / ${limit}` : ' (no limit)'}` + (extra ? `  ${extra}` : '')),
    limit ? bar : h('span')];
  }

  async function viewOperations() {
    const seq = renderSeq;
    const charts = h('div', { class: 'charts', id: 'charts' });
    const tenantBox = h('div', { id: 'ops-tenant' });
    append(main, h('h1', null, 'Operations'), tenantBox,
      h('h2', null, 'This engramd: the last hour as the server kept it, then /metrics every 3 s'),
      charts);
    const draw = () => {
      clear(charts);
      const ms = (v) => `${fmtNum(v, v < 10 ? 2 : 0)} ms`;
      const chart = (title, id, series, fmt) => h('div', { class: 'card chart', id },
        h('h3', null, title),
        h('div', { class: 'legend' }, series.map((s) => {
          const sw = h('i');
          sw.style.background = s.color;
          const last = points.length ? points[points.length - 1][s.key] : null;
          return h('span', null, sw, `${s.label}: ${last === null || last === undefined ? '\u2013' : fmt(last)}`);
        })),
        EngramMetrics.lineChart(points, series.filter((s) => !s.legendOnly), fmt));
      append(charts,
        chart('Requests per second', 'chart-qps', [
          { key: 'qps', label: 'requests/s', color: '#1f4e79' },
          { key: 'eps', label: 'errors/s', color: '#a4262c' }], (v) => fmtNum(v, 1)),
        chart('Latency', 'chart-latency', [
          { key: 'p50', label: 'p50', color: '#2e7d32' },
          { key: 'p99', label: 'p99', color: '#a4262c' },
          { key: 'mean', label: 'mean', color: '#1f4e79' }], ms),
        chart('Index memory', 'chart-memory', [
          { key: 'indexBytes', label: 'index', color: '#1f4e79' },
          { key: 'budgetBytes', label: 'budget', color: '#b26a00', legendOnly: true },
          { key: 'rssBytes', label: 'process RSS', color: '#7b1fa2' }], fmtBytes));
    };
    const scrape = async () => {
      try {
        const res = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
        if (!res.ok) throw new ApiError('unavailable', `/metrics answered ${res.status}`);
        const text = await res.text();
        scrapes.push({ t: Date.now() + clockSkew, samples: EngramMetrics.parse(text) });
        while (scrapes.length > 2) scrapes.shift();
        if (scrapes.length === 2) {
          points.push(EngramMetrics.derive(scrapes[0], scrapes[1]));
          const last = points[points.length - 1].t;
          while (points.length && points[0].t < last - 3600e3) points.shift();
        }
        if (seq === renderSeq) draw();
      } catch (e) { showError(e); }
    };
    // the last hour from the server (its samples every metrics_history_step_s), so the
    // charts do not start empty; live scrapes continue from there
    const history = async () => {
      try {
        const res = await fetch('/metrics/history', { cache: 'no-store', credentials: 'omit' });
        if (!res.ok) throw new ApiError('unavailable', `/metrics/history answered ${res.status}`);
        const hist = await res.json();
        clockSkew = hist.now - Date.now();
        points.length = 0;
        scrapes.length = 0;
        points.push(...EngramMetrics.fromHistory(hist));
        charts.dataset.historyPoints = String(points.length);
      } catch (e) { showError(e); }
    };
    draw();
    await history();
    if (seq !== renderSeq) return;
    draw();
    scrape();
    poller = setInterval(scrape, 3000);

    if (!state.key) {
      append(tenantBox, h('p', { class: 'muted' }, 'Pick a tenant (Tenants) to see its usage ' +
        'and consolidation runs.'));
      return;
    }
    const [u, st, runs] = await Promise.all([call('tenant.usage', {}), call('memory.stats', {}),
      call('memory.consolidation.runs', { limit: 50 })]);
    if (seq !== renderSeq) return;
    const ix = st.index || {};
    append(tenantBox,
      h('div', { class: 'split' },
        h('div', { class: 'card', id: 'usage' }, h('h2', null, `Usage (tier ${u.tier})`),
          h('div', { class: 'usage' },
            usageRow('Memories', u.memories.stored, u.memories.limit,
                     `(${u.memories.archived} archived, not counted)`),
            usageRow('Queries today', u.queries.today, u.queries.limit,
                     u.queries.resets_at ? `resets ${fmtTime(u.queries.resets_at)}` : ''),
            usageRow('Live sessions', u.sessions.live, u.sessions.limit,
                     u.sessions.retention_days ? `kept ${u.sessions.retention_days} days` : '')),
          kv([['storage', fmtBytes(u.storage_bytes)],
              ['rate', `${u.rate.per_second}/s, burst ${u.rate.burst}`]])),
        h('div', { class: 'card', id: 'stats' }, h('h2', null, 'Memories and index'),
          kv([['live / archived', `${st.total} / ${st.archived}`],
              ['by type', Object.entries(st.by_type || {}).map(([k, v]) => `${k} ${v}`).join(', ')],
              ['by scope', Object.entries(st.by_scope || {}).map(([k, v]) => `${k} ${v}`).join(', ')],
              ['oldest / newest', `${fmtTime(st.oldest_at)} / ${fmtTime(st.newest_at)}`],
              ['index', ix.loaded ? `${ix.kind}, ${ix.vectors} vectors, engine ${ix.engine_in_use}` +
                (ix.recall_estimate !== null && ix.recall_estimate !== undefined ?
                  `, recall ${fmtNum(ix.recall_estimate)}` : '') : `not loaded (engine ${ix.engine})`]]))),
      h('h2', null, 'Consolidation runs'),
      runs.runs.length ? table(['run#', 'trigger', 'status', 'started', 'duration#',
        'merged#', 'superseded#', 'rescored#', 'archived#', 'skipped#', 'error'],
      runs.runs.map((r) => h('tr', { 'data-run': r.run_id }, tdNum(r.run_id), td(r.trigger),
        td(h('span', { class: 'tag ' + (r.status === 'completed' ? 'ok' : 'bad') }, r.status)),
        td(fmtTime(r.started_at)), tdNum(r.duration_ms === null ? '' : `${r.duration_ms} ms`),
        tdNum(r.merged), tdNum(r.superseded), tdNum(r.rescored), tdNum(r.archived),
        tdNum(r.skipped), td(r.error || ''))))
        : h('p', { class: 'muted', id: 'no-runs' }, 'No consolidation runs yet.'));
  }

  // -- tenants (admin) -------------------------------------------------------------------------
  async function viewTenants() {
    const seq = renderSeq;
    const all = [];
    let cursor = null;
    for (let i = 0; i < 20; i++) {
      const p = { limit: 1000 };
      if (cursor) p.cursor = cursor;
      const r = await call('admin.tenant.list', p, true);
      all.push(...r.tenants);
      cursor = r.next_cursor;
      if (!cursor) break;
    }
    if (seq !== renderSeq) return;
    append(main, h('h1', null, 'Tenants'),
      h('p', { class: 'muted' }, 'Opening a tenant creates an API key of it named ' +
        '\u201cconsole \u2026\u201d for this browser tab; logging out (or opening another ' +
        'tenant) revokes it.'),
      table(['tenant#', 'name', 'tier', 'embedding', 'engine', 'memories#', 'keys#', 'created', ''],
        all.map((t) => {
          const open = h('button', { type: 'button', class: 'secondary', 'data-open': t.tenant_id },
                         'Open');
          open.addEventListener('click', async () => {
            try {
              await openTenant(t);
              location.hash = '#/memories';
              route();
            } catch (e) { showError(e); }
          });
          return h('tr', null,
            tdNum(t.tenant_id), td([t.name, state.tenantId === t.tenant_id
              ? [' ', h('span', { class: 'tag ok' }, 'open')] : null]), td(t.tier),
            td(t.embedding ? `${t.embedding.provider} ${t.embedding.dim}` : ''),
            td(t.index_engine), tdNum(t.memories), tdNum(t.keys), td(fmtTime(t.created_at)),
            td(open));
        })));
  }

  // -- routing ---------------------------------------------------------------------------------
  function header(view) {
    const nav = document.getElementById('nav');
    const who = document.getElementById('who');
    const out = document.getElementById('logout');
    const logged = !!(state.key || state.adminKey);
    nav.hidden = !logged;
    out.hidden = !logged;
    document.getElementById('nav-tenants').hidden = state.mode !== 'admin';
    for (const a of nav.querySelectorAll('a'))
      a.classList.toggle('active', a.dataset.view === view);
    who.textContent = !logged ? '' : state.mode === 'admin'
      ? `admin${state.tenantId ? ` \u00b7 tenant ${state.tenantName} (${state.tenantId})` : ''}`
      : `tenant ${state.tenantName || ''} (${state.tenantId}) \u00b7 ${state.tier}`;
  }

  async function route() {
    renderSeq++;
    if (poller) { clearInterval(poller); poller = null; }
    clear(main);
    const parts = location.hash.replace(/^#\/?/, '').split('/');
    let view = parts[0] || '';
    const logged = !!(state.key || state.adminKey);
    if (!logged) view = 'login';
    else if (state.mode === 'admin' && !state.key && view !== 'operations') view = 'tenants';
    else if (!view || view === 'login') view = 'memories';
    const navView = { memory: 'memories', session: 'sessions' }[view] || view;
    header(navView);
    document.title = `Engram console \u00b7 ${navView}`;
    main.dataset.view = view;
    try {
      switch (view) {
        case 'login': viewLogin(); break;
        case 'memories': viewMemories(); break;
        case 'memory': await viewMemory(Number(parts[1])); break;
        case 'sessions': viewSessions(); break;
        case 'session': await viewSession(Number(parts[1]), parts[2]); break;
        case 'operations': await viewOperations(); break;
        case 'tenants': await viewTenants(); break;
        default: append(main, h('p', null, 'No such page.'));
      }
      main.dataset.ready = String(renderSeq);
    } catch (e) {
      showError(e);
    }
  }

  document.getElementById('logout').addEventListener('click', () => { logout(); });
  window.addEventListener('hashchange', () => { showError(null); route(); });
  route();
})();
