// The report's own script (inlined by pipeline/report/render.py after plotly.js): draws each figure when it comes
// near the viewport, makes tables sortable and filterable, and runs the latent explorer. Data strings only ever reach
// the page through textContent or attributes, never as markup.
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("plotly-config").textContent);
  var template = JSON.parse(document.getElementById("plotly-template").textContent);  // shared by every figure

  // --- figures: drawn when near the viewport (or when a <details> holding them opens) -------------------------------
  var pending = {};
  function draw(div) {
    var spec = pending[div.id];
    if (!spec) return;
    delete pending[div.id];
    var f = JSON.parse(spec.textContent);
    if (f.layout.template === undefined) f.layout.template = template;
    Plotly.newPlot(div, f.data, f.layout, config);
  }
  var specs = document.querySelectorAll("script.figure-spec");
  var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (e) { if (e.isIntersecting) { observer.unobserve(e.target); draw(e.target); } });
    if (!window.cedarFirstDraw) window.cedarFirstDraw = performance.now();
  }, {rootMargin: "300px"}) : null;
  specs.forEach(function (spec) {
    var div = document.getElementById(spec.getAttribute("data-for"));
    pending[div.id] = spec;
    if (observer) observer.observe(div); else draw(div);
  });
  function drawAll() { Object.keys(pending).forEach(function (id) { draw(document.getElementById(id)); }); }

  // --- tables: sort on a header click (aria-sort), filter by a text box ----------------------------------------------
  function cellValue(row, column) {
    var cell = row.cells[column];
    if (!cell) return "";
    var v = cell.getAttribute("data-v");
    if (v === null) v = cell.textContent.trim();
    var n = parseFloat(v);
    return (v !== "" && !isNaN(n) && /^[-+]?[0-9.]/.test(v)) ? n : v.toLowerCase();
  }
  function sortTable(table, column, th) {
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("thead th").forEach(function (h) { h.setAttribute("aria-sort", "none"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, column), y = cellValue(b, column);
      var missingX = x === "–" || x === "", missingY = y === "–" || y === "";
      if (missingX !== missingY) return missingX ? 1 : -1;  // missing values last, either way
      if (typeof x === typeof y) return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
      return (typeof x === "number" ? -1 : 1);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th, column) {
      th.setAttribute("aria-sort", "none");
      th.tabIndex = 0;
      th.addEventListener("click", function () { sortTable(table, column, th); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortTable(table, column, th); });
    });
  });
  document.querySelectorAll("input.table-filter").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-for"));
    input.addEventListener("input", function () {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var text = row.textContent.toLowerCase();
        row.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      });
    });
  });
  document.querySelectorAll("select.k-filter").forEach(function (select) {
    select.addEventListener("change", function () {
      document.querySelectorAll(select.getAttribute("data-rows")).forEach(function (row) {
        row.hidden = select.value !== "" && row.getAttribute("data-k") !== select.value;
      });
    });
    select.dispatchEvent(new Event("change"));
  });

  // --- the latent explorer ------------------------------------------------------------------------------------------
  var explorerData = document.getElementById("explorer-data");
  var explorer = explorerData ? JSON.parse(explorerData.textContent) : null;
  var PAGE = 12;  // cards drawn per panel before "show more"
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function tile(index, size, title) {
    var t = el("span", "sp");
    t.setAttribute("role", "img");
    if (title) t.title = title;
    t.style.setProperty("--s", size + "px");
    if (index >= 0) {
      t.style.setProperty("--c", index % explorer.columns);
      t.style.setProperty("--r", Math.floor(index / explorer.columns));
    } else t.classList.add("none");
    return t;
  }
  function histogram(counts, max) {
    var ns = "http://www.w3.org/2000/svg", w = 160, h = 44, n = counts.length;
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + (h + 12));
    svg.setAttribute("class", "hist");
    var top = Math.max.apply(null, counts.concat([1]));
    counts.forEach(function (c, i) {
      var r = document.createElementNS(ns, "rect"), bh = c ? Math.max(1, h * c / top) : 0;
      r.setAttribute("x", (i * w / n).toFixed(1)); r.setAttribute("width", (w / n - 1).toFixed(1));
      r.setAttribute("y", (h - bh).toFixed(1)); r.setAttribute("height", bh.toFixed(1));
      var tip = document.createElementNS(ns, "title");
      tip.textContent = c + " images with activation in [" + (i * max / n).toPrecision(2) + ", " + ((i + 1) * max / n).toPrecision(2) + ")";
      r.appendChild(tip);
      svg.appendChild(r);
    });
    [["0", 0, "start"], [max === null ? "" : max.toPrecision(3), w, "end"]].forEach(function (l) {
      var t = document.createElementNS(ns, "text");
      t.setAttribute("x", l[1]); t.setAttribute("y", h + 11); t.setAttribute("text-anchor", l[2]);
      t.textContent = l[0];
      svg.appendChild(t);
    });
    return svg;
  }
  function matches(latent, query) {
    if (!query) return true;
    var q = query.toLowerCase().trim();
    if (/^[+-]?\d+$/.test(q)) {  // an id: "12" finds latent 12 (and a rotation's half-axes +12 and -12), "+12" only +12
      return latent.id === q || (/^\d/.test(q) && latent.id.replace(/^[+-]/, "") === q);
    }
    return latent.n.some(function (w) { return explorer.words[w].toLowerCase().indexOf(q) >= 0; }) ||
      Object.keys(latent.m).some(function (k) { return latent.m[k] && explorer.words[latent.m[k][0]].toLowerCase().indexOf(q) >= 0; });
  }
  function card(run, latent) {
    var c = el("div", "card");
    c.setAttribute("data-latent", latent.id);
    var head = el("div", "card-head");
    head.appendChild(el("b", null, "latent " + latent.id));
    head.appendChild(el("span", "muted", " active on " + (100 * latent.f).toFixed(1) + "% of test images"));
    c.appendChild(head);
    var kinds = Object.keys(latent.m);
    var match = el("div", "card-match");
    kinds.forEach(function (kind) {
      var m = latent.m[kind];
      match.appendChild(el("span", "kv", kind + ": " + (m ? explorer.words[m[0]] + " (F1 " + m[1].toFixed(2) + ")" : "no attribute")));
    });
    Object.keys(latent.c).forEach(function (kind) {
      match.appendChild(el("span", "kv coal", "FBMP coalition of " + latent.c[kind].map(function (w) { return explorer.words[w]; }).join(", ") + " (" + kind + ")"));
    });
    c.appendChild(match);
    var names = el("div", "card-names");
    if (!run.named) names.appendChild(el("span", "muted", "(no concept vocabulary)"));
    var floor = run.floor ? run.floor.p95 : null;
    latent.n.forEach(function (w, i) {
      var chip = el("span", "concept" + (floor !== null && latent.s[i] < floor ? " weak" : ""), explorer.words[w] + " ");
      chip.appendChild(el("span", "s", latent.s[i].toFixed(2)));
      if (floor !== null && latent.s[i] < floor) chip.title = "cosine below the noise floor " + floor.toFixed(2);
      names.appendChild(chip);
    });
    c.appendChild(names);
    var body = el("div", "card-body");
    var images = el("div", "card-images");
    latent.r.forEach(function (row, i) {
      var fig = el("figure");
      fig.appendChild(tile(row in explorer.tiles ? explorer.tiles[row] : -1, 80, "test image " + row));
      fig.appendChild(el("figcaption", null, latent.v[i] === undefined || latent.v[i] === null ? "" : latent.v[i].toPrecision(3)));
      images.appendChild(fig);
    });
    body.appendChild(images);
    if (latent.h.length) {
      var hist = el("div", "card-hist");
      hist.appendChild(el("div", "muted", "activations where active"));
      hist.appendChild(histogram(latent.h, latent.hm));
      body.appendChild(hist);
    }
    c.appendChild(body);
    return c;
  }
  function panel(root, side) {
    var select = root.querySelector("select.run-select");
    var sort = root.querySelector("select.card-sort");
    var list = root.querySelector(".cards");
    var summary = root.querySelector(".run-summary");
    var pairs = root.querySelector(".run-pairs");
    var shown = PAGE;
    function run() { return explorer.runs[select.selectedIndex]; }
    function render() {
      var r = run(), query = document.getElementById("latent-search").value;
      var latents = r.latents.filter(function (l) { return matches(l, query); });
      var key = sort.value;
      latents = latents.slice().sort(function (a, b) {
        if (key === "name") return b.s[0] - a.s[0];
        if (key === "match") return best(b) - best(a);
        return b.f - a.f;
      });
      summary.textContent = r.method + " · k = " + r.k + (r.size ? " · " + r.size + " latents" : "") + " · MATCHScore " +
        (r.score === null ? "–" : r.score.toFixed(3)) + " · " + latents.length + " of " + r.latents.length + " kept latents" +
        (r.floor ? " · naming noise floor " + r.floor.p95.toFixed(2) + " (95th pct. of random directions)" : "");
      list.textContent = "";
      latents.slice(0, shown).forEach(function (l) { list.appendChild(card(r, l)); });
      if (latents.length > shown) {
        var more = el("button", "more", "show " + Math.min(PAGE, latents.length - shown) + " more");
        more.addEventListener("click", function () { shown += PAGE; render(); });
        list.appendChild(more);
      }
      if (!latents.length) list.appendChild(el("p", "muted", "no latent of this run matches the search"));
      pairs.textContent = "";
      r.pairs.forEach(function (p) {
        var box = el("div", "pair");
        box.appendChild(tile(p.before, 64, "before"));
        box.appendChild(tile(p.after, 64, "after"));
        box.appendChild(el("div", "edit", p.edit));
        box.appendChild(el("div", "kind", p.kind + " pair " + p.pair));
        [["on", p.on], ["off", p.off]].forEach(function (d) {
          var line = el("div", "switch");
          line.appendChild(el("span", d[0], d[0] + ": "));
          line.appendChild(document.createTextNode(d[1].length ? d[1].map(function (s) { return s[0] + " " + s[1]; }).join(", ") : "–"));
          box.appendChild(line);
        });
        pairs.appendChild(box);
      });
    }
    function best(l) {
      return Math.max.apply(null, Object.keys(l.m).map(function (k) { return l.m[k] ? l.m[k][1] : 0; }).concat([0]));
    }
    explorer.runs.forEach(function (r) {
      select.appendChild(el("option", null, r.run + " (" + r.method + ", k = " + r.k + ")"));
    });
    var index = explorer.runs.map(function (r) { return r.run; }).indexOf(explorer.open[side]);
    select.selectedIndex = index >= 0 ? index : 0;
    select.addEventListener("change", function () { shown = PAGE; render(); });
    sort.addEventListener("change", render);
    return render;
  }
  var renders = [];
  if (explorer) {
    document.querySelectorAll(".explorer-panel").forEach(function (root, side) { renders.push(panel(root, side)); });
    document.getElementById("latent-search").addEventListener("input", function () { renders.forEach(function (r) { r(); }); });
    renders.forEach(function (r) { r(); });
  }

  // --- the build time: the file's own modification time, so the bytes stay the same for the same records --------------
  var written = new Date(document.lastModified);
  if (!isNaN(written)) {
    document.querySelectorAll(".built-time").forEach(function (e) {
      e.textContent = written.toISOString().slice(0, 16).replace("T", " ") + " UTC";
    });
  }

  window.cedarReport = {drawAll: drawAll};
})();
