"use strict";
var frames = [], byEl = new Map(), zoomed = null, query = null, ic = false;
var st, matched, unzoomBtn, searchBtn, icBtn, defStatus = "";

function txt(el, s) { if (el.textContent !== s) el.textContent = s; }
function fmt(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

function init() {
  st = document.getElementById("status");
  matched = document.getElementById("matched");
  unzoomBtn = document.getElementById("unzoom");
  searchBtn = document.getElementById("search");
  icBtn = document.getElementById("ic");
  defStatus = st.textContent;
  var gs = document.querySelectorAll("g.f");
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], t = g.querySelector("title").textContent;
    var f = {g: g, r: g.querySelector("rect"), t: g.querySelector("text"), tip: t,
             name: t.slice(0, t.lastIndexOf(" (")),
             s: +g.getAttribute("data-s"), n: +g.getAttribute("data-n"),
             d: +g.getAttribute("data-d"), m: false};
    f.fill = f.r.getAttribute("fill");
    frames.push(f);
    byEl.set(g, f);
  }
  var fg = document.getElementById("frames");
  fg.addEventListener("click", function (e) {
    var f = frameOf(e.target);
    if (f) { zoomFrame(f); writeHash(); }
  });
  fg.addEventListener("mouseover", function (e) {
    var f = frameOf(e.target);
    if (f) txt(st, f.tip);
  });
  fg.addEventListener("mouseout", function () { txt(st, defStatus); });
  unzoomBtn.addEventListener("click", function () { unzoom(); });
  searchBtn.addEventListener("click", function () {
    if (query !== null) resetSearch(); else searchPrompt();
  });
  icBtn.addEventListener("click", function () { toggleIc(); });
  window.addEventListener("keydown", function (e) {
    var k = e.key;
    if (k === "F3" || ((e.ctrlKey || e.metaKey) && (k === "f" || k === "F"))) {
      e.preventDefault(); searchPrompt();
    } else if ((e.ctrlKey || e.metaKey) && (k === "i" || k === "I")) {
      e.preventDefault(); toggleIc();
    } else if (k === "Escape") {
      resetSearch();
    }
  });
  window.addEventListener("hashchange", readHash);
  window.addEventListener("popstate", readHash);
  readHash();
  document.documentElement.setAttribute("data-ready", "1");
}

function frameOf(el) {
  var g = el && el.closest ? el.closest("g.f") : null;
  return g ? byEl.get(g) : null;
}

function label(f, w) {
  var c = Math.floor((w - 2 * P.tp) / P.cw), s = "";
  if (c >= 3) s = f.name.length <= c ? f.name : f.name.slice(0, c - 2) + "..";
  txt(f.t, s);
}

function layout() {
  var zs = 0, zn = P.total, zd = 0;
  if (zoomed) { zs = zoomed.s; zn = zoomed.n; zd = zoomed.d; }
  var ze = zs + zn, k = P.plotw / zn;
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], x, w, anc = false;
    if (f.d >= zd && f.s >= zs && f.s + f.n <= ze) {
      x = P.xpad + (f.s - zs) * k; w = f.n * k;
    } else if (f.d < zd && f.s <= zs && f.s + f.n >= ze) {
      x = P.xpad; w = P.plotw; anc = true;
    } else {
      f.g.classList.add("h");
      continue;
    }
    f.g.classList.remove("h");
    f.g.classList.toggle("p", anc);
    f.r.setAttribute("x", x.toFixed(2));
    f.r.setAttribute("width", w.toFixed(2));
    f.t.setAttribute("x", (x + P.tp).toFixed(2));
    label(f, w);
  }
  unzoomBtn.classList.toggle("dis", !zoomed);
}

function zoomFrame(f) {
  zoomed = (f && f.d > 0) ? f : null;
  layout();
}

function zoomTo(x, y) {
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i];
    if (f.d === y && f.s <= x && x < f.s + f.n) { zoomFrame(f); writeHash(); return true; }
  }
  return false;
}

function unzoom() { zoomFrame(null); writeHash(); }

function doSearch(term) {
  var re;
  try { re = new RegExp(term, ic ? "i" : ""); }
  catch (e) { txt(st, "Invalid regular expression: " + term); return -1; }
  query = term;
  var iv = [];
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], hit = f.d > 0 && re.test(f.name);
    if (hit) iv.push(f);
    if (hit !== f.m) { f.m = hit; f.r.setAttribute("fill", hit ? P.hl : f.fill); }
  }
  // nested matches count once: a frame inside the last counted one adds nothing
  iv.sort(function (a, b) { return a.s - b.s || b.n - a.n; });
  var sum = 0, end = -1;
  for (var j = 0; j < iv.length; j++) {
    var s = iv[j].s, e2 = s + iv[j].n;
    if (s >= end) { sum += iv[j].n; end = e2; }
    else if (e2 > end) { sum += e2 - end; end = e2; }
  }
  var pct = 100 * sum / P.total;
  txt(matched, "Matched: " + pct.toFixed(2) + "% (" + fmt(sum) + " " + P.unit + ")");
  txt(searchBtn, "Reset Search");
  searchBtn.classList.add("on");
  return pct;
}

function search(term) {
  if (term === undefined || term === null || term === "") { resetSearch(); return 0; }
  var pct = doSearch(String(term));
  writeHash();
  return pct;
}

function clearSearch() {
  query = null;
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i];
    if (f.m) { f.m = false; f.r.setAttribute("fill", f.fill); }
  }
  txt(matched, "");
  txt(searchBtn, "Search");
  searchBtn.classList.remove("on");
}

function resetSearch() { clearSearch(); writeHash(); }

function searchPrompt() {
  var t = window.prompt("Search for a regular expression (" +
                        (ic ? "case-insensitive" : "case-sensitive") + "):", query || "");
  if (t !== null && t !== "") search(t);
}

function setIc(v) {
  ic = v;
  icBtn.classList.toggle("on", ic);
}

function toggleIc() {
  setIc(!ic);
  if (query !== null) doSearch(query);
  writeHash();
}

function writeHash() {
  var p = [];
  if (zoomed) p.push("x=" + zoomed.s, "y=" + zoomed.d);
  if (query !== null) p.push("q=" + encodeURIComponent(query));
  if (ic) p.push("i=1");
  var h = p.length ? "#" + p.join("&") : "";
  if (h === location.hash || (h === "" && location.hash === "#")) return;
  try {
    history.pushState(null, "", h === "" ? location.pathname + location.search : h);
  } catch (e) {
    location.hash = h;
  }
}

function readHash() {
  var h = location.hash.replace(/^#/, ""), a = {};
  h.split("&").forEach(function (kv) {
    var i = kv.indexOf("=");
    if (i > 0) {
      try { a[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1)); } catch (e) { }
    }
  });
  setIc(a.i === "1");
  var target = null;
  if (a.x !== undefined && a.y !== undefined) {
    var x = +a.x, y = +a.y;
    for (var i = 0; i < frames.length; i++) {
      var f = frames[i];
      if (f.d === y && f.s <= x && x < f.s + f.n) { target = f; break; }
    }
  }
  zoomFrame(target);
  if (a.q !== undefined && a.q !== "") doSearch(a.q); else clearSearch();
}

window.addEventListener("load", init);
