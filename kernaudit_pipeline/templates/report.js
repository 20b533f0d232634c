/* kernaudit report: sortable and paged tables, one filter bar for tables and charts, charts drawn
   from their specs once plotly.js is unpacked. No network: everything is in this file. */
(function () {
  'use strict';
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  /* --- the sticky bar: anchors land below it ------------------------------------------------ */
  function measureBar() {
    const bar = $('#bar');
    if (bar) document.documentElement.style.setProperty('--bar-h', bar.offsetHeight + 'px');
  }
  window.addEventListener('resize', measureBar);
  measureBar();

  /* --- filters ------------------------------------------------------------------------------ */
  const FILTERS = ['kernel', 'status', 'decision', 'review', 'text'];
  function filterValues() {
    const out = {};
    FILTERS.forEach((name) => {
      const el = $('#f-' + name);
      out[name] = el ? el.value.trim() : '';
    });
    out.text = out.text.toLowerCase();
    return out;
  }
  function rowMatches(tr, applies, f) {
    for (const name of applies) {
      const want = f[name];
      if (!want) continue;
      if (name === 'text') {
        if (!tr.textContent.toLowerCase().includes(want)) return false;
      } else if (tr.dataset[name] !== undefined && tr.dataset[name] !== want) {
        return false;
      }
    }
    return true;
  }

  /* --- tables: sort, filter, page, say "N of M" --------------------------------------------- */
  const tables = [];
  function cellValue(td) {
    if (!td) return '';
    const v = td.dataset.v;
    if (v !== undefined) {            // an explicit sort key; blank when the value is missing
      if (v === '') return '';
      const n = Number(v);
      return Number.isNaN(n) ? v.toLowerCase() : n;
    }
    const text = td.textContent.trim().toLowerCase();
    return text === '–' ? '' : text;
  }
  function compare(a, b) {
    const an = typeof a === 'number', bn = typeof b === 'number';
    if (an && bn) return a - b;
    if (an) return -1;          // numbers before blanks and words
    if (bn) return 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function setupTable(table) {
    const body = table.tBodies[0];
    if (!body) return;
    const state = {
      table, body, rows: Array.from(body.rows).filter((r) => !r.classList.contains('empty')),
      applies: (table.dataset.filters || '').split(/\s+/).filter(Boolean),
      pageSize: Number(table.dataset.pageSize || 0), page: 0, showAll: false, noun: table.dataset.noun || 'rows',
      foot: document.getElementById(table.id + '-foot'),
    };
    $$('thead th', table).forEach((th, index) => {
      if (th.dataset.nosort !== undefined) return;
      th.classList.add('sortable');
      th.setAttribute('role', 'columnheader');
      th.setAttribute('aria-sort', 'none');
      th.title = 'sort by ' + th.textContent.trim();
      th.addEventListener('click', () => {
        const ascending = th.getAttribute('aria-sort') !== 'ascending';
        $$('thead th', table).forEach((other) => other.classList.contains('sortable') && other.setAttribute('aria-sort', 'none'));
        th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
        state.rows.sort((ra, rb) => {
          const a = cellValue(ra.cells[index]), b = cellValue(rb.cells[index]);
          if (a === '' || b === '') return a === b ? 0 : (a === '' ? 1 : -1);  // missing values last, both ways
          const c = compare(a, b);
          return ascending ? c : -c;
        });
        state.rows.forEach((r) => body.appendChild(r));
        state.page = 0;
        render(state);
      });
    });
    if (state.foot) {
      state.foot.addEventListener('click', (ev) => {
        const act = ev.target.dataset.act;
        if (!act) return;
        if (act === 'prev') state.page = Math.max(0, state.page - 1);
        if (act === 'next') state.page += 1;
        if (act === 'all') state.showAll = !state.showAll;
        render(state);
      });
    }
    tables.push(state);
  }
  function render(state) {
    const f = filterValues();
    const matching = state.rows.filter((tr) => rowMatches(tr, state.applies, f));
    const pages = state.pageSize && !state.showAll ? Math.max(1, Math.ceil(matching.length / state.pageSize)) : 1;
    state.page = Math.min(state.page, pages - 1);
    const start = state.pageSize && !state.showAll ? state.page * state.pageSize : 0;
    const end = state.pageSize && !state.showAll ? start + state.pageSize : matching.length;
    const visible = new Set(matching.slice(start, end));
    state.rows.forEach((tr) => { tr.hidden = !visible.has(tr); });
    state.table.dataset.shown = String(visible.size);
    state.table.dataset.matching = String(matching.length);
    if (!state.foot) return;
    const total = state.rows.length;
    let text;
    if (visible.size === total) {
      text = `all ${total} ${state.noun}`;
    } else {
      text = `showing ${visible.size ? start + 1 : 0}–${start + visible.size} of ${matching.length} ${state.noun}`;
      if (matching.length !== total) text += ` (filtered from ${total})`;
    }
    const count = $('.count', state.foot);
    if (count) count.textContent = text;
    const pager = $('.pager', state.foot);
    if (pager) {
      pager.hidden = !state.pageSize || matching.length <= state.pageSize;
      $('[data-act=prev]', pager).disabled = state.showAll || state.page === 0;
      $('[data-act=next]', pager).disabled = state.showAll || state.page >= pages - 1;
      $('[data-act=all]', pager).textContent = state.showAll ? `pages of ${state.pageSize}` : `show all ${matching.length}`;
      $('.page', pager).textContent = state.showAll ? '' : `page ${state.page + 1} of ${pages}`;
    }
  }

  /* --- charts ------------------------------------------------------------------------------- */
  const charts = [];
  function chartVisible(section, f) {
    return !(f.kernel && section.dataset.kernel !== undefined && section.dataset.kernel !== f.kernel);
  }
  function traceVisible(meta, applies, f) {
    if (!meta) return true;
    if (applies.includes('kernel') && f.kernel && meta.kernel !== undefined && meta.kernel !== f.kernel) return false;
    if (applies.includes('status') && f.status && meta.status !== undefined && meta.status !== f.status) return false;
    return true;
  }
  function applyToChart(item, f) {
    const { section, div, applies } = item;
    const show = chartVisible(section, f);
    const was = !section.hidden;
    section.hidden = !show;
    if (!item.drawn || !window.Plotly) return;
    const visible = div.data.map((t) => (traceVisible(t.meta, applies, f) ? true : false));
    const current = div.data.map((t) => t.visible !== false);
    if (visible.some((v, i) => v !== current[i])) window.Plotly.restyle(div, { visible });
    if (show && !was) window.Plotly.Plots.resize(div);
  }
  function drawAll() {
    const queue = charts.slice();
    const next = () => {
      const item = queue.shift();
      if (!item) { document.body.dataset.charts = 'drawn'; return; }
      const spec = JSON.parse(item.specEl.textContent);
      item.div.innerHTML = '';
      window.Plotly.newPlot(item.div, spec.data, spec.layout, { displaylogo: false, responsive: true }).then(() => {
        item.drawn = true;
        applyToChart(item, filterValues());
        setTimeout(next, 0);
      });
    };
    next();
  }
  async function loadPlotly() {
    const packed = $('#plotly-gz');
    if (!packed || !charts.length) return;
    if (typeof DecompressionStream === 'undefined') {
      charts.forEach((c) => { c.div.textContent = 'This browser cannot unpack the charts (no DecompressionStream); the tables hold every number.'; });
      return;
    }
    const bytes = Uint8Array.from(atob(packed.textContent.trim()), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    const source = await new Response(stream).text();
    const url = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
    const script = document.createElement('script');
    script.src = url;
    script.onload = () => { URL.revokeObjectURL(url); drawAll(); };
    document.head.appendChild(script);
  }

  /* --- wiring ------------------------------------------------------------------------------- */
  function applyFilters() {
    const f = filterValues();
    tables.forEach(render);
    charts.forEach((c) => applyToChart(c, f));
    const active = FILTERS.filter((n) => f[n]).length;
    const out = $('#f-count');
    if (out) {
      const shown = tables.reduce((n, t) => n + Number(t.table.dataset.shown || 0), 0);
      const hiddenCharts = charts.filter((c) => c.section.hidden).length;
      out.textContent = active ? `${shown} table rows shown; ${charts.length - hiddenCharts} of ${charts.length} charts` : '';
    }
  }
  $$('table.data').forEach(setupTable);
  $$('section.chart').forEach((section) => {
    const specEl = document.getElementById(section.dataset.spec);
    const div = $('.chart-body', section);
    if (specEl && div) charts.push({ section, div, specEl, applies: (section.dataset.filters || '').split(/\s+/), drawn: false });
  });
  FILTERS.forEach((name) => {
    const el = $('#f-' + name);
    if (el) el.addEventListener(name === 'text' ? 'input' : 'change', applyFilters);
  });
  const reset = $('#f-reset');
  if (reset) reset.addEventListener('click', () => { FILTERS.forEach((n) => { const el = $('#f-' + n); if (el) el.value = ''; }); applyFilters(); });
  applyFilters();
  loadPlotly();
})();
