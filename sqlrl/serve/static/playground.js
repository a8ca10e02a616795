// The playground: ask the server (POST /generate), run the SQL (POST /execute), store a
// judgement (POST /feedback). Plain DOM, no framework, nothing fetched but this server's
// routes; every text from the server is put in the page as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
// what the answer on screen was asked about and what the model said (for feedback)
let asked = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// a JSON call to the server; a refusal throws its reason (`detail`, or OpenAI's error message)
async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: headers(),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const reason = (data && (data.detail || (data.error && data.error.message))) || response.statusText;
    throw new Error(`${response.status}: ${reason}`);
  }
  return data;
}

function say(id, text, kind) {
  const el = $(id);
  el.textContent = text;
  el.className = kind || "";
}

async function loadDatabases() {
  const select = $("db");
  try {
    const data = await call("GET", "/databases");
    select.replaceChildren();
    for (const db of data.databases) {
      const option = document.createElement("option");
      option.value = db.db_id;
      option.textContent = db.present ? db.db_id : `${db.db_id} (no file: cannot run)`;
      option.title = db.tables.join(", ");
      select.append(option);
    }
    if (!data.databases.length) say("status", "the server has no databases: paste DDL", "error");
    else say("status", `${data.databases.length} databases`, "muted");
  } catch (err) {
    say("status", `databases: ${err.message}` + (err.message.startsWith("401") ? " (enter the API key above)" : ""), "error");
  }
}

function usingDatabase() {
  return $("source-db").checked;
}

function showSource() {
  $("db").disabled = !usingDatabase();
  $("ddl").hidden = usingDatabase();
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  const body = { question };
  if (usingDatabase()) body.db_id = $("db").value;
  else body.ddl = $("ddl").value;
  say("status", "asking the model…", "muted");
  $("ask").disabled = true;
  try {
    const answer = await call("POST", "/generate", body);
    asked = { ...body, predicted_sql: answer.sql };
    showAnswer(answer);
    say("status", `answered in ${answer.usage.generation_seconds} s`, "muted");
  } catch (err) {
    say("status", err.message, "error");
  } finally {
    $("ask").disabled = false;
  }
}

function showAnswer(answer) {
  $("answer").hidden = false;
  $("sql").value = answer.sql;
  const meta = [];
  if (answer.vote) meta.push(`${answer.votes} of ${answer.num_samples} samples agree (${answer.vote} vote)`);
  $("meta").textContent = meta.join("; ");
  showTrace(answer.trace);
  $("run").disabled = !usingDatabase();
  $("run").title = usingDatabase() ? "" : "only the server's databases can be queried";
  $("save-correction").disabled = true;
  say("feedback-status", "");
  $("rows").replaceChildren();
  $("rows-note").textContent = "";
}

// an agent model's trace ({probes: [{query, observation}], final_sql}): each query it ran
// and what the database answered, then its final SQL ("" when it ran out of turns)
function showTrace(trace) {
  const list = $("trace");
  list.replaceChildren();
  $("trace-box").hidden = !trace || !Array.isArray(trace.probes);
  if ($("trace-box").hidden) return;
  for (const probe of trace.probes) {
    const item = document.createElement("li");
    const query = document.createElement("pre");
    query.className = "probe-query";
    query.textContent = probe.query;
    const observation = document.createElement("pre");
    observation.className = "probe-observation";
    observation.textContent = probe.observation;
    item.append(query, observation);
    list.append(item);
  }
  const final = document.createElement("li");
  final.className = "final-sql";
  final.textContent = trace.final_sql ? "answer: " + trace.final_sql : "no final answer (out of turns)";
  list.append(final);
}

async function run() {
  if (!asked || !asked.db_id) return;
  say("rows-note", "running…", "muted");
  try {
    const result = await call("POST", "/execute", {
      db_id: asked.db_id,
      sql: $("sql").value,
      max_rows: Number($("max-rows").value),
    });
    showRows(result);
  } catch (err) {
    $("rows").replaceChildren();
    say("rows-note", err.message, "error");
  }
}

function showRows(result) {
  const table = $("rows");
  table.replaceChildren();
  if (result.verdict.status !== "ok") {
    say("rows-note", `${result.verdict.status}: ${result.verdict.error}`, "error");
    return;
  }
  const head = table.createTHead().insertRow();
  for (const name of result.columns) {
    const th = document.createElement("th");
    th.textContent = name;
    head.append(th);
  }
  const body = table.createTBody();
  for (const row of result.rows) {
    const tr = body.insertRow();
    for (const value of row) tr.insertCell().textContent = value === null ? "NULL" : String(value);
  }
  const n = result.rows.length;
  say("rows-note", `${n} row${n === 1 ? "" : "s"}` + (result.truncated ? " (more not shown)" : ""), "muted");
}

async function judge(verdict, corrected) {
  if (!asked) return;
  const body = {
    question: asked.question,
    predicted_sql: asked.predicted_sql,
    verdict,
  };
  if (asked.db_id !== undefined) body.db_id = asked.db_id;
  else body.ddl = asked.ddl;
  if (corrected !== undefined) body.corrected_sql = corrected;
  try {
    const stored = await call("POST", "/feedback", body);
    const what = corrected !== undefined ? "correction" : `"${verdict}"`;
    say("feedback-status", `saved your ${what} (#${stored.id}), thank you`, "ok");
  } catch (err) {
    say("feedback-status", err.message, "error");
  }
}

function edited() {
  $("save-correction").disabled = !asked || $("sql").value.trim() === asked.predicted_sql.trim();
}

async function showModel() {
  try {
    const models = await call("GET", "/v1/models");
    $("model").textContent = "model: " + models.data[0].id;
  } catch (err) {
    $("model").textContent = "";
  }
}

function start() {
  $("key").value = sessionStorage.getItem("sqlrl-key") || "";
  $("key").addEventListener("change", () => {
    sessionStorage.setItem("sqlrl-key", $("key").value.trim());
    loadDatabases();
    showModel();
  });
  $("source-db").addEventListener("change", showSource);
  $("source-ddl").addEventListener("change", showSource);
  $("ask-form").addEventListener("submit", ask);
  $("run").addEventListener("click", run);
  $("sql").addEventListener("input", edited);
  $("right").addEventListener("click", () => judge("right"));
  $("wrong").addEventListener("click", () => judge("wrong"));
  $("save-correction").addEventListener("click", () => judge("wrong", $("sql").value.trim()));
  showSource();
  loadDatabases();
  showModel();
}

document.addEventListener("DOMContentLoaded", start);
