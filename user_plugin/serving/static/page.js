// The page of vaswani-serve: translate the text of the box (POST /translate), then draw the
// encoder-decoder attention of one sentence (POST /attention) for the chosen layer and head.
// Plain script, no build step, no library: the heatmap is drawn on a canvas.
"use strict";

// Viridis (the colour map of vaswani-plot-attention), as 9 stops linearly interpolated.
const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
                 [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]];

function colour(value) {
  const x = Math.min(1, Math.max(0, value)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const t = x - i;
  return VIRIDIS[i].map((low, k) => Math.round(low + t * (VIRIDIS[i + 1][k] - low)));
}

const $ = (id) => document.getElementById(id);
let attention = null;  // the last /attention answer

function say(id, text, error) {
  $(id).textContent = text;
  $(id).classList.toggle("error", Boolean(error));
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({error: `HTTP ${response.status}`}));
  if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
  return answer;
}

function options() {
  const chosen = {};
  if ($("beam").value !== "") chosen.beam = Number($("beam").value);
  if ($("lenpen").value !== "") chosen.lenpen = Number($("lenpen").value);
  return chosen;
}

function fillSelect(select, count, label) {
  const previous = select.value;
  select.replaceChildren();
  for (let i = 0; i < count; i++) {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = label(i);
    select.append(option);
  }
  if (previous !== "" && Number(previous) < count) select.value = previous;
}

async function translate() {
  const lines = $("source").value.split("\n");
  while (lines.length && !lines[lines.length - 1].trim()) lines.pop();
  $("run").disabled = true;
  say("status", "translating...");
  try {
    const answer = await post("/translate", {text: lines, ...options()});
    const list = $("translations");
    list.replaceChildren(...answer.translations.map((text) => {
      const item = document.createElement("li");
      item.textContent = text;
      return item;
    }));
    say("status", `${lines.length} sentence(s), model ${answer.model.slice(0, 12)}`);
    document.body.dataset.state = "translated";
    const sentences = lines.map((line, i) => [line, i]).filter(([line]) => line.trim());
    const select = $("sentence");
    select.replaceChildren(...sentences.map(([line, i]) => {
      const option = document.createElement("option");
      option.value = line;
      option.textContent = `${i + 1}: ${line.length > 40 ? line.slice(0, 40) + "..." : line}`;
      return option;
    }));
    if (sentences.length) await showAttention();
  } catch (error) {
    say("status", error.message, true);
    document.body.dataset.state = "error";
  } finally {
    $("run").disabled = false;
  }
}

async function showAttention() {
  if (!window.vaswaniModel || !window.vaswaniModel.attention) return;
  const sentence = $("sentence").value;
  say("attention-status", "reading the attention...");
  try {
    attention = await post("/attention", {text: sentence, ...options()});
    const first = $("layer").options.length === 0;
    fillSelect($("layer"), attention.layers, (i) => `${i + 1} of ${attention.layers}`);
    fillSelect($("head"), attention.heads, (i) => `${i + 1} of ${attention.heads}`);
    if (first) $("layer").value = String(attention.layers - 1);  // the top layer, at first
    draw();
  } catch (error) {
    say("attention-status", error.message, true);
  }
}

function draw() {
  if (!attention) return;
  const layer = Number($("layer").value), head = Number($("head").value);
  const weights = attention.weights[layer][head];
  const rows = attention.target_tokens, columns = attention.source_tokens;
  const canvas = $("heatmap");
  const context = canvas.getContext("2d");
  const font = "12px sans-serif";
  context.font = font;
  const widest = (labels) => Math.max(...labels.map((t) => context.measureText(t).width));
  const cell = Math.max(14, Math.min(32, Math.floor(640 / Math.max(rows.length, columns.length))));
  const left = Math.ceil(widest(rows)) + 10, top = Math.ceil(widest(columns)) + 10;
  canvas.width = left + cell * columns.length + 4;
  canvas.height = top + cell * rows.length + 4;
  context.fillStyle = "#ffffff";
  context.fillRect(0, 0, canvas.width, canvas.height);
  const peak = Math.max(1e-9, ...weights.flat());
  weights.forEach((row, r) => row.forEach((value, c) => {
    const [red, green, blue] = colour(value / peak);
    context.fillStyle = `rgb(${red}, ${green}, ${blue})`;
    context.fillRect(left + c * cell, top + r * cell, cell, cell);
  }));
  context.font = font;
  context.fillStyle = "#1d1d1f";
  context.textBaseline = "middle";
  context.textAlign = "right";
  rows.forEach((label, r) => context.fillText(label, left - 5, top + r * cell + cell / 2));
  columns.forEach((label, c) => {
    context.save();
    context.translate(left + c * cell + cell / 2, top - 5);
    context.rotate(-Math.PI / 2);
    context.textAlign = "left";
    context.fillText(label, 0, 0);
    context.restore();
  });
  Object.assign(canvas.dataset, {layer, head, cell, left, top, peak,
                                 rows: rows.length, columns: columns.length, drawn: "true"});
  say("attention-status", `layer ${layer + 1}, head ${head + 1} (largest weight ` +
      `${peak.toFixed(2)}): ${attention.translation}`);
}

async function describeModel() {
  try {
    const response = await fetch("/model");
    const model = await response.json();
    if (!response.ok) throw new Error(model.error || `HTTP ${response.status}`);
    window.vaswaniModel = model;
    $("model").textContent = `${model.source_lang} → ${model.target_lang}, ${model.backend} ` +
      `backend, model ${model.fingerprint.slice(0, 12)}; beam ${model.decoding.beam}, ` +
      `α ${model.decoding.lenpen}, at most ${model.decoding.max_length}`;
    $("beam").placeholder = String(model.decoding.beam);
    $("lenpen").placeholder = String(model.decoding.lenpen);
    $("attention").hidden = !model.attention;
    document.body.dataset.state = "ready";
  } catch (error) {
    $("model").textContent = `the model is not ready (${error.message}); reload in a moment`;
  }
}

$("run").addEventListener("click", translate);
$("sentence").addEventListener("change", showAttention);
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
window.vaswaniPage = {colour, translate, draw};
describeModel();
