// The playground: ask the server (POST /generate), run the SQL (POST /execute), store a
// judgement (POST /feedback), show the selected database's schema (GET /databases/{db_id}).
// A live database (a PostgreSQL or SQLite one connected with --database) is listed with its
// dialect; Run shows the SQL as it ran there (transpiled) above the rows.
// Plain DOM, no framework, nothing fetched but this server's routes; every text from the
// server is put in the page as text, never as HTML.
//
// The page never shows an answer to anything but what is on screen: an answer is bound to
// the question and the schema (database, or DDL) it was asked about, and editing either one
// clears it and disables its buttons until the next ask; so does a failed ask. Editing the
// SQL itself is a correction: it keeps the answer and clears the notices and rows of the
// text before the edit.
"use strict";

const $ = (id) => document.getElementById(id);
// the answer on screen: what was asked ({question, db_id | ddl}) and the model's predicted_sql
let asked = null;
// the ask in flight (its request body); null once an edit of the inputs made it stale
let asking = null;
// the requests in flight for the answer on screen (their buttons are disabled meanwhile)
let running = false;
let judging = false;
// the correction last stored for the answer on screen (saving it again would duplicate it)
let savedCorrection = null;

function pageToken() {
  const meta = document.querySelector('meta[name="sqlrl-page-token"]');
  return meta ? meta.content : "";
}

function headers(withBody) {
  const h = {};
  if (withBody) {
    h["Content-Type"] = "application/json";
    // the server takes feedback without an API key only from its own page: this token
    h["X-SQLRL-Page-Token"] = pageToken();
  }
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// a JSON call to the server; a refusal throws its reason (`detail`, or OpenAI's error message)
async function call(method, path, body) {
  const withBody = body !== undefined;
  const response = await fetch(path, {
    method,
    headers: headers(withBody),
    body: withBody ? JSON.stringify(body) : undefined,
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const reason = (data && (data.detail || (data.error && data.error.message))) || response.statusText;
    throw new Error(`${response.status}: ${typeof reason === "string" ? reason : JSON.stringify(reason)}`);
  }
  return data;
}

function say(id, text, kind) {
  const el = $(id);
  el.textContent = text;
  el.className = kind || "";
}

function keyHint(err) {
  return err.message.startsWith("401") ? " (enter the API key above)" : "";
}

async function loadDatabases() {
  const select = $("db");
  const selected = select.value;
  try {
    const data = await call("GET", "/databases");
    select.replaceChildren();
    for (const db of data.databases) {
      const option = document.createElement("option");
      option.value = db.db_id;
      option.textContent = db.live ? `${db.db_id} (live ${db.dialect})`
        : db.present ? db.db_id : `${db.db_id} (no file: cannot run)`;
      option.title = db.tables.join(", ");
      select.append(option);
    }
    if (data.databases.some((db) => db.db_id === selected)) select.value = selected;
    if (!data.databases.length) say("status", "the server has no databases: paste DDL", "error");
    else say("status", `${data.databases.length} databases`, "muted");
  } catch (err) {
    say("status", `databases: ${err.message}` + keyHint(err), "error");
  }
  inputsChanged("the database");
  loadSchema();
}

function usingDatabase() {
  return $("source-db").checked;
}

function showSource() {
  $("db").disabled = !usingDatabase();
  $("ddl").hidden = usingDatabase();
  inputsChanged("the schema");
  loadSchema();
}

// the selected database's tables, one line each: columns (primary keys underlined, types on
// hover) and the column each foreign key refers to
async function loadSchema() {
  const box = $("schema-box");
  const db = $("db").value;
  if (!usingDatabase() || !db) {
    box.hidden = true;
    box.dataset.db = "";
    return;
  }
  if (box.dataset.db === db && !box.hidden) return;
  box.hidden = false;
  box.dataset.db = db;
  $("schema-name").textContent = db;
  $("schema").replaceChildren();
  say("schema-note", "loading…", "muted");
  let schema;
  try {
    schema = await call("GET", "/databases/" + encodeURIComponent(db));
  } catch (err) {
    if ($("db").value === db) say("schema-note", err.message + keyHint(err), "error");
    box.dataset.db = "";  // try again on the next change (the key, say)
    return;
  }
  if ($("db").value !== db || !usingDatabase()) return;  // another one was picked meanwhile
  showSchema(schema);
}

function showSchema(schema) {
  const refs = new Map();
  for (const fk of schema.foreign_keys) refs.set(`${fk.table}.${fk.column}`, fk);
  const list = $("schema");
  list.replaceChildren();
  for (const table of schema.tables) {
    const item = document.createElement("li");
    const name = document.createElement("b");
    name.textContent = table.name;
    item.append(name, ": ");
    table.columns.forEach((column, i) => {
      if (i) item.append(", ");
      const col = document.createElement(column.primary_key ? "u" : "span");
      col.textContent = column.name;
      col.title = column.type + (column.primary_key ? ", primary key" : "");
      if (column.primary_key) col.className = "pk";
      item.append(col);
      const fk = refs.get(`${table.name}.${column.name}`);
      if (fk) {
        const ref = document.createElement("span");
        ref.className = "fk";
        ref.textContent = ` → ${fk.ref_table}.${fk.ref_column}`;
        ref.title = "foreign key";
        item.append(ref);
      }
    });
    list.append(item);
  }
  const n = schema.tables.length;
  say("schema-note", `${n} table${n === 1 ? "" : "s"}; underlined: primary key; →: foreign key`, "muted");
}

// what an ask now would be about
function inputsNow() {
  const now = { question: $("question").value.trim() };
  if (usingDatabase()) now.db_id = $("db").value;
  else now.ddl = $("ddl").value;
  return now;
}

function sameInputs(a, b) {
  return a.question === b.question && a.db_id === b.db_id && a.ddl === b.ddl;
}

// an input of the ask changed (`what` names it): an answer (or an ask in flight) about
// something else is cleared
function inputsChanged(what) {
  const now = inputsNow();
  if (asking && !sameInputs(asking, now)) {
    asking = null;
    $("ask").disabled = false;
    say("status", `${what} changed while the model was answering: ask again`, "muted");
  }
  if (asked && !sameInputs(asked, now)) {
    clearAnswer();
    say("status", `${what} changed: ask again for an answer about it`, "muted");
  }
}

// no answer on screen: the SQL, its rows, the notices gone and its buttons disabled
function clearAnswer() {
  asked = null;
  savedCorrection = null;
  $("sql").value = "";
  $("meta").textContent = "";
  showTrace(null);
  clearRows();
  say("feedback-status", "");
  setButtons();
}

function clearRows() {
  $("rows").replaceChildren();
  say("rows-note", "");
  $("executed").hidden = true;
}

function setButtons() {
  const sql = $("sql").value.trim();
  $("sql").disabled = !asked;
  $("run").disabled = !asked || !asked.db_id || running || !sql;
  $("run").title = asked && !asked.db_id ? "only the server's databases can be queried" : "";
  $("right").disabled = !asked || judging;
  $("wrong").disabled = !asked || judging;
  $("save-correction").disabled = !asked || judging || !sql
    || sql === asked.predicted_sql.trim() || sql === savedCorrection;
}

async function ask(event) {
  event.preventDefault();
  const body = inputsNow();
  if (!body.question) return;
  // a new ask replaces the answer on screen, whatever comes back
  clearAnswer();
  asking = body;
  say("status", "asking the model…", "muted");
  $("ask").disabled = true;
  try {
    const answer = await call("POST", "/generate", body);
    if (asking !== body) return;  // the question or schema changed meanwhile
    asked = { ...body, predicted_sql: answer.sql };
    showAnswer(answer);
    say("status", `answered in ${answer.usage.generation_seconds} s`, "muted");
  } catch (err) {
    if (asking !== body) return;
    say("status", err.message + keyHint(err), "error");
  } finally {
    if (asking === body) {
      asking = null;
      $("ask").disabled = false;
    }
  }
}

function showAnswer(answer) {
  $("answer").hidden = false;
  $("sql").value = answer.sql;
  const meta = [asked.db_id ? `about ${asked.db_id}` : "about the CREATE TABLE statements"];
  if (answer.vote) meta.push(`${answer.votes} of ${answer.num_samples} samples agree (${answer.vote} vote)`);
  if (answer.seed !== undefined) meta.push(`sampled with seed ${answer.seed}`);
  const tables = answer.schema_tables;
  if (tables && tables.dropped.length) {
    meta.push(`the prompt kept ${tables.kept.length} of ${tables.kept.length + tables.dropped.length} tables (${tables.kept.join(", ")}): ${tables.why}`);
  }
  $("meta").textContent = meta.join("; ");
  showTrace(answer.trace);
  clearRows();
  say("feedback-status", "");
  setButtons();
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

// the SQL in the box, run on the database its answer was asked about (never another one)
async function run() {
  if (!asked || !asked.db_id) return;
  const answer = asked;
  const sql = $("sql").value;
  running = true;
  setButtons();
  say("rows-note", "running…", "muted");
  try {
    const result = await call("POST", "/execute", {
      db_id: answer.db_id,
      sql,
      max_rows: Number($("max-rows").value),
    });
    if (asked === answer && $("sql").value === sql) showRows(result);
  } catch (err) {
    if (asked === answer && $("sql").value === sql) {
      clearRows();
      say("rows-note", err.message, "error");
    }
  } finally {
    running = false;
    setButtons();
  }
}

// A cell as a person reads it: NULL for null, a float to 12 significant digits (SQLite's
// avg() gives 11.350000000000001 for 11.35), anything else as it came.
function cellText(value) {
  if (value === null) return "NULL";
  if (typeof value === "number" && !Number.isInteger(value)) {
    return String(Number(value.toPrecision(12)));
  }
  return String(value);
}

function showRows(result) {
  const table = $("rows");
  table.replaceChildren();
  $("executed").hidden = !result.executed_sql;
  $("executed-dialect").textContent = result.dialect || "";
  $("executed-sql").textContent = result.executed_sql || "";
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
    for (const value of row) tr.insertCell().textContent = cellText(value);
  }
  const n = result.rows.length;
  say("rows-note", `${n} row${n === 1 ? "" : "s"}` + (result.truncated ? " (more not shown)" : ""), "muted");
}

// store a verdict on the answer on screen; the server runs the SQL it vouches for first and
// refuses (422, with the database's error) one that does not run: nothing is stored then
async function judge(verdict, corrected) {
  if (!asked) return;
  const answer = asked;
  const body = {
    question: answer.question,
    predicted_sql: answer.predicted_sql,
    verdict,
  };
  if (answer.db_id !== undefined) body.db_id = answer.db_id;
  else body.ddl = answer.ddl;
  if (corrected !== undefined) body.corrected_sql = corrected;
  judging = true;
  setButtons();
  say("feedback-status", "saving…", "muted");
  try {
    const stored = await call("POST", "/feedback", body);
    if (asked !== answer) return;  // the answer on screen is another one now
    if (corrected !== undefined) savedCorrection = corrected;
    const what = corrected !== undefined ? "correction" : `"${verdict}"`;
    say("feedback-status", `saved your ${what} (#${stored.id}), thank you`, "ok");
  } catch (err) {
    if (asked === answer) say("feedback-status", err.message + keyHint(err), "error");
  } finally {
    judging = false;
    setButtons();
  }
}

// the SQL was edited: a correction of the answer, which stays; what was said about the text
// before the edit (the saved notice, the rows) goes
function edited() {
  say("feedback-status", "");
  clearRows();
  setButtons();
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
  $("db").addEventListener("change", () => {
    inputsChanged("the database");
    loadSchema();
  });
  for (const event of ["input", "change"]) {
    $("question").addEventListener(event, () => inputsChanged("the question"));
    $("ddl").addEventListener(event, () => inputsChanged("the schema"));
  }
  $("ask-form").addEventListener("submit", ask);
  $("run").addEventListener("click", run);
  $("sql").addEventListener("input", edited);
  $("right").addEventListener("click", () => judge("right"));
  $("wrong").addEventListener("click", () => judge("wrong"));
  $("save-correction").addEventListener("click", () => judge("wrong", $("sql").value.trim()));
  showSource();
  setButtons();
  loadDatabases();
  showModel();
}

document.addEventListener("DOMContentLoaded", start);
