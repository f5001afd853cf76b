"""The report page's own stylesheet and script: the page loads nothing else."""

STYLE = """
:root { --done:#2f9e5b; --failed:#d64545; --journal:#3b82c4; --skipped:#d99a1e;
  --interrupted:#8e5cc9; --ink:#1d2430; --muted:#667085; --line:#e4e7ec; --bg:#fbfbfc; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  background: var(--bg); margin: 0 auto; padding: 24px 32px 64px; max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 32px 0 10px;
  border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
h4 { font-size: 13px; margin: 12px 0 4px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { white-space: pre-wrap; word-break: break-word; background: #f2f4f7; padding: 8px 10px;
  border-radius: 6px; margin: 4px 0; max-height: 360px; overflow: auto; }
.meta { color: var(--muted); } .warn { color: var(--failed); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px;
  background: #eef0f3; color: var(--ink); white-space: nowrap; }
.badge.state-done, .badge.state-finished, .badge.verdict-confirmed {
  background: #dcf3e5; color: #1c6b3c; }
.badge.state-failed, .badge.verdict-refuted { background: #fbe0e0; color: #9b2323; }
.badge.state-journal { background: #deebf7; color: #1f5a91; }
.badge.state-skipped, .badge.state-budget, .badge.verdict-unclear { background: #fbefd6;
  color: #8a5a00; }
.badge.state-interrupted { background: #ece3f7; color: #5e3591; }
.badge.severity-high { background: var(--failed); color: #fff; }
.badge.severity-medium { background: var(--skipped); color: #fff; }
.badge.severity-low { background: var(--journal); color: #fff; }
.badge.severity-info, .badge.severity-other { background: #d0d5dd; }
dl.totals { display: grid; grid-template-columns: repeat(auto-fill, minmax(128px, 1fr));
  gap: 10px; margin: 0; }
.total { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.total dt { color: var(--muted); font-size: 12px; } .total dd { margin: 0; font-size: 19px;
  font-weight: 600; font-variant-numeric: tabular-nums; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin-bottom: 8px; }
.legend-item { display: inline-flex; align-items: center; gap: 5px; cursor: pointer; }
.swatch { display: inline-block; width: 14px; height: 10px; border-radius: 2px; }
.state-done.swatch, .bar.state-done { background-color: var(--done); }
.state-failed.swatch, .bar.state-failed { background-color: var(--failed); }
.state-journal.swatch, .bar.state-journal { background-color: var(--journal); }
.state-skipped.swatch, .bar.state-skipped, .state-budget.swatch, .bar.state-budget {
  background-color: var(--skipped); }
.state-interrupted.swatch, .bar.state-interrupted { background-color: var(--interrupted); }
.role-verifier.swatch, .bar.role-verifier { background-image: repeating-linear-gradient(135deg,
  rgba(255,255,255,.45) 0 3px, transparent 3px 7px); }
.role-resolver.swatch, .bar.role-resolver { background-image: repeating-linear-gradient(90deg,
  rgba(0,0,0,.3) 0 2px, transparent 2px 5px); }
figure.fanout { margin: 0 0 18px; background: #fff; border: 1px solid var(--line);
  border-radius: 8px; padding: 8px 12px; }
figcaption { font-weight: 600; margin-bottom: 6px; }
.lane { display: flex; align-items: center; height: 16px; }
.lane-label { flex: 0 0 240px; overflow: hidden; white-space: nowrap; text-overflow: ellipsis;
  font-size: 12px; color: var(--muted); padding-right: 8px; }
.track { position: relative; flex: 1; height: 100%; border-left: 1px solid var(--line); }
.lane:not(.axis) .track {
  background: linear-gradient(var(--line), var(--line)) 0 50% / 100% 1px no-repeat; }
.axis { height: 18px; } .tick { position: absolute; top: 0; font-size: 11px; color: var(--muted);
  border-left: 1px solid var(--line); padding-left: 3px; height: 100%; }
.bar { position: absolute; top: 3px; height: 10px; min-width: 3px; border-radius: 2px; }
.bar:hover, .bar:focus { outline: 2px solid var(--ink); z-index: 1; }
.hide-done .bar.state-done, .hide-failed .bar.state-failed, .hide-journal .bar.state-journal,
.hide-skipped .bar.state-skipped, .hide-interrupted .bar.state-interrupted,
.hide-budget .bar.state-budget { visibility: hidden; }
.severity-group ul, ul.agent-findings, ul.notices { list-style: none; padding: 0; margin: 0; }
.finding { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px;
  margin: 4px 0; } .finding .source { display: block; color: var(--muted); font-size: 12px; }
.claim { font-weight: 500; }
article.turn { background: #fff; border: 1px solid var(--line); border-radius: 8px;
  padding: 4px 14px 10px; margin-bottom: 12px; }
.notice { color: var(--journal); } .step { margin: 6px 0; font-weight: 500; }
ul.compactions { list-style: none; padding: 0; margin: 4px 0; }
.compaction, .condensed { margin: 3px 0; color: #8a5a00; }
.badge.context { background: #fbefd6; color: #8a5a00; }
code.report-path, code.patch-path { word-break: break-all; }
.badge.change-merged { background: #dcf3e5; color: #1c6b3c; }
.badge.change-conflict, .badge.change-refused { background: #fbe0e0; color: #9b2323; }
.badge.change-not-merged { background: #fbefd6; color: #8a5a00; }
.badge.change-kept { background: #deebf7; color: #1f5a91; }
.change .lines { font-variant-numeric: tabular-nums; }
table.commands { border-collapse: collapse; width: 100%; margin: 4px 0; }
table.commands td, table.commands th { border-bottom: 1px solid var(--line); padding: 3px 8px;
  text-align: left; vertical-align: top; }
table.commands th { color: var(--muted); font-weight: 500; }
table.commands tr.bad td:nth-child(2) { color: var(--failed); }
table.network, table.approvals { border-collapse: collapse; width: 100%; margin: 4px 0;
  background: #fff; } table.network td, table.network th, table.approvals td,
table.approvals th { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left;
  vertical-align: top; } tr.traffic th { font-weight: 500; background: #f7f8fa; }
table.network td:nth-child(n+6) { font-variant-numeric: tabular-nums; }
code.what { word-break: break-all; }
.badge.decision-allowed, .badge.decision-approved { background: #dcf3e5; color: #1c6b3c; }
.badge.decision-denied { background: #fbe0e0; color: #9b2323; }
.badge.decision-failed, .badge.decision-other { background: #fbefd6; color: #8a5a00; }
.badge.decision-timed-out { background: #ece3f7; color: #5e3591; }
details.agent { background: #fff; border: 1px solid var(--line); border-radius: 6px;
  margin: 4px 0; padding: 4px 10px; } details.agent[open] { padding-bottom: 10px; }
details.agent summary { cursor: pointer; }
details.agent:target { outline: 2px solid var(--journal); }
div.nested-call { margin: 10px 0 0 14px; padding-left: 10px; border-left: 2px solid var(--line); }
dl.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr));
  gap: 2px 12px; } dl.facts dt { color: var(--muted); font-size: 12px; } dl.facts dd { margin: 0; }
.md { overflow-wrap: anywhere; } div.md > :first-child { margin-top: 0; }
div.md > :last-child { margin-bottom: 0; } .md p { margin: 4px 0 8px; }
div.md h1, div.md h2, div.md h3, div.md h4, div.md h5, div.md h6 { color: var(--ink);
  text-transform: none; letter-spacing: normal; border: 0; padding: 0; margin: 12px 0 4px; }
div.md h1 { font-size: 17px; } div.md h2 { font-size: 15.5px; } div.md h3 { font-size: 14.5px; }
div.md h4, div.md h5, div.md h6 { font-size: 14px; }
div.md ul, div.md ol { margin: 4px 0 8px; padding-left: 24px; } div.md ul { list-style: disc; }
div.md ol { list-style: decimal; } div.md li { margin: 2px 0; }
.md code { background: #f2f4f7; border-radius: 4px; padding: 0 3px; }
.md pre code { background: none; padding: 0; }
.md blockquote { margin: 4px 0; padding: 2px 12px; border-left: 3px solid var(--line);
  color: var(--muted); }
.md hr { border: 0; border-top: 1px solid var(--line); }
.md table { border-collapse: collapse; margin: 6px 0; display: block; max-width: 100%;
  overflow-x: auto; }
.md th, .md td { border: 1px solid var(--line); padding: 3px 8px; text-align: left;
  vertical-align: top; } .md th { background: #f2f4f7; font-weight: 600; }
.md a { color: var(--journal); } .md-image { color: var(--muted); }
div.evidence { background: #f7f8fa; border-left: 3px solid var(--line); padding: 4px 10px;
  margin: 4px 0; border-radius: 0 6px 6px 0; }
div.answer { margin: 4px 0; } .claim.md p { margin: 2px 0; }
"""

SCRIPT = """
(function () {
  "use strict";
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    for (var el = target; el; el = el.parentElement) {  // a nested agent: open its makers too
      if (el.tagName === "DETAILS") { el.open = true; }
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  var timeline = document.getElementById("timeline");
  document.querySelectorAll("input[data-toggle]").forEach(function (box) {
    box.addEventListener("change", function () {
      timeline.classList.toggle("hide-" + box.dataset.toggle, !box.checked);
    });
  });
  document.body.dataset.ready = "yes";
})();
"""
