// raas dashboard: confirm before cancel, auto-refresh, and the lazy token view. No libraries.
"use strict";

document.addEventListener("submit", (e) => {
  const msg = e.target.dataset.confirm;
  if (msg && !window.confirm(msg)) e.preventDefault();
});

// Replace `el`'s contents with its data-refresh fragment every `ms` while `again()` holds.
function refresh(el, ms, again) {
  if (!el || !again()) return;
  setTimeout(async () => {
    try {
      const resp = await fetch(el.dataset.refresh, {headers: {Accept: "text/html"}});
      if (resp.ok) el.innerHTML = await resp.text();
    } catch (err) { /* the next tick retries */ }
    refresh(el, ms, again);
  }, ms);
}

const jobRows = document.getElementById("job-rows");
refresh(jobRows, 2000, () => jobRows.querySelector('tr[data-status="running"], tr[data-status="cancelling"]'));
const stagesBody = document.getElementById("stages-body");
refresh(stagesBody, 3000, () => true);
if (window.RAAS_RELOAD) setTimeout(() => window.location.reload(), window.RAAS_RELOAD);

// ---- token view ----
const conv = document.getElementById("conversation");
const tip = document.getElementById("tip");
const segmentData = new WeakMap();   // .tokbox -> the segment's JSON
let pinned = null;

function shown(piece) {
  if (piece === "") return "∅";
  return piece.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function shade(tok, mask, lp) {
  if (mask !== 1) return;
  const p = lp === null ? 1 : Math.exp(lp);
  tok.style.background = `hsl(${Math.round(120 * p)}, 70%, 82%)`;
}

function renderSegment(box, data) {
  const frag = document.createDocumentFragment();
  const drift = new Set(JSON.parse(conv.dataset.drift || "[]"));
  for (let i = 0; i < data.ids.length; i++) {
    const tok = document.createElement("span");
    const mask = data.mask[i];
    tok.className = mask === 1 ? "tok m1" : "tok m0";
    if (drift.has(data.start + i)) tok.classList.add("drift");
    tok.dataset.i = i;
    tok.textContent = data.pieces ? shown(data.pieces[i]) : `⟨${data.ids[i]}⟩`;
    shade(tok, mask, data.logprobs[i]);
    frag.appendChild(tok);
  }
  box.replaceChildren(frag);
  segmentData.set(box, data);
  box.dataset.loaded = String(data.ids.length);
}

async function loadSegment(details) {
  const box = details.querySelector(".tokbox");
  if (box.dataset.loaded || box.dataset.loading) return;
  box.dataset.loading = "1";
  box.textContent = "loading…";
  const resp = await fetch(`${conv.dataset.tokens}?segment=${details.dataset.segment}`,
                           {headers: {Accept: "application/json"}});
  if (!resp.ok) { box.textContent = `could not load tokens (${resp.status})`; delete box.dataset.loading; return; }
  renderSegment(box, await resp.json());
  delete box.dataset.loading;
  details.dispatchEvent(new CustomEvent("tokens-loaded", {bubbles: true}));
}

function describe(tok) {
  const box = tok.parentElement;
  const d = segmentData.get(box);
  const i = Number(tok.dataset.i);
  const lp = d.logprobs[i];
  const lines = [`token #${d.start + i}   id ${d.ids[i]}`,
    `piece ${JSON.stringify(d.pieces ? d.pieces[i] : null)}`,
    `mask ${d.mask[i]} (${d.mask[i] === 1 ? "trained" : "not trained"})`,
    `logprob ${lp === null ? "–" : lp}` + (lp === null ? "" : `   p ${Math.exp(lp).toFixed(4)}`),
    `policy version ${d.versions[i] === null ? "–" : d.versions[i]}`];
  if (JSON.parse(conv.dataset.drift || "[]").includes(d.start + i)) lines.push("drift audit: first divergence of this turn");
  return lines.join("\n");
}

function showTip(tok, x, y) {
  tip.textContent = describe(tok);
  tip.hidden = false;
  tip.style.left = `${Math.min(x + 14, window.innerWidth - 320)}px`;
  tip.style.top = `${Math.min(y + 14, window.innerHeight - 110)}px`;
}

if (conv) {
  conv.addEventListener("toggle", (e) => {
    if (e.target.matches("details.tokens") && e.target.open) loadSegment(e.target);
  }, true);
  conv.addEventListener("mouseover", (e) => {
    const tok = e.target.closest(".tok");
    if (tok && tok.parentElement.classList.contains("tokbox") && !pinned) showTip(tok, e.clientX, e.clientY);
  });
  conv.addEventListener("mouseout", (e) => {
    if (e.target.closest(".tok") && !pinned) tip.hidden = true;
  });
  conv.addEventListener("click", (e) => {
    const tok = e.target.closest(".tokbox .tok");
    if (!tok) return;
    if (pinned) pinned.classList.remove("sel");
    if (pinned === tok) { pinned = null; tip.hidden = true; return; }
    pinned = tok;
    tok.classList.add("sel");
    showTip(tok, e.clientX, e.clientY);
  });
  // One request for every segment: 30 turns opened one by one would be 30 round trips.
  document.getElementById("expand-all").addEventListener("click", async () => {
    const all = [...conv.querySelectorAll("details.tokens")];
    const resp = await fetch(`${conv.dataset.tokens}?segment=all`, {headers: {Accept: "application/json"}});
    if (!resp.ok) { all.forEach((d) => { d.open = true; }); return; }
    const {segments} = await resp.json();
    all.forEach((d) => {
      const box = d.querySelector(".tokbox");
      if (!box.dataset.loaded) renderSegment(box, segments[Number(d.dataset.segment)]);
      d.open = true;
    });
  });
  document.querySelectorAll(".goto-token").forEach((a) => a.addEventListener("click", (e) => {
    e.preventDefault();
    const details = conv.querySelector(`details.tokens[data-segment="${a.dataset.segment}"]`);
    if (!details) return;
    const go = () => {
      const box = details.querySelector(".tokbox");
      const tok = box.children[Number(a.dataset.pos) - Number(details.dataset.start)];
      if (tok) { tok.scrollIntoView({block: "center"}); tok.click(); }
    };
    if (details.querySelector(".tokbox").dataset.loaded) go();
    else { details.addEventListener("tokens-loaded", go, {once: true}); details.open = true; }
  }));
}
