// The Temporality web console: a single page over the journal API (same origin), no build step.
// Safe rendering: every value from the API goes into the page through textContent / attributes,
// never innerHTML. The API token lives in sessionStorage (this tab only) and goes out as a Bearer header;
// a person signed in with the OIDC provider has no token here: the journal's HttpOnly session cookie goes
// out instead, and every call carries X-Temporality-Console (the journal refuses a cookie call that changes
// something without it: another site's page cannot send it).

const TOKEN_KEY = "temporality.console.token";
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const ROLES = { viewer: 1, operator: 2, admin: 3 };
const STATES = ["pending", "running", "waiting_for_human", "waiting_for_agent", "resuming", "completed", "failed",
  "cancelled"];

let me = null; // {name, role, kind, user} of the signed-in token or person (role null: inbox only)
let authConfig = null; // GET /auth/config: {oidc: {provider, login} | null, password: {login} | null}
const CONSOLE_HEADER = { "X-Temporality-Console": "1" };
const signedInPerson = () => me?.kind === "person";
const SESSION_ENDED = "Your session ended (signed out, expired, or changed in the directory): sign in again.";
let pendingMessage = null; // {text, kind}: shown once the next view is rendered (a hash change clears the old one)
let viewAbort = null; // aborts the current view's fetches and live tail
const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ DOM helpers (no innerHTML)
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed under the CSP, unlike style=""
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(...nodes) {
  const view = $("view");
  view.replaceChildren(...nodes);
}

// The line under the bar: an error (kind "error", an ARIA alert), or a notice ("info") or a done action ("success"),
// which are a polite status (role=status): announced, not alarming.
function message(text, kind = "error") {
  const box = $("message");
  delete box.dataset.transient;
  if (!text) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  const known = ["info", "success"].includes(kind) ? kind : "error";
  box.className = `message ${known === "error" ? "" : known}`;
  box.dataset.kind = known;
  box.setAttribute("role", known === "error" ? "alert" : "status");
  box.textContent = text;
  box.hidden = false;
}

// An instant in this browser's time, its zone named ("7 Dec 2026, 16:38:52 CET"; "GMT+1" where the locale has no
// abbreviation): a page shared across zones, or read beside a chat message in UTC, says which time it means.
function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "long" });
}

// The since / until of an address, written with their offset ("2026-12-07T15:41+01:00"): a shared link means the
// same instants in every zone. ``local`` is a datetime-local field's value (this browser's time).
const pad2 = (n) => String(n).padStart(2, "0");
export function withOffset(local) {
  const d = new Date(local);
  if (!local || Number.isNaN(d.getTime())) return local;
  const minutes = -d.getTimezoneOffset();
  const abs = Math.abs(minutes);
  return `${local}${minutes === 0 ? "Z" : `${minutes > 0 ? "+" : "-"}${pad2(Math.floor(abs / 60))}:${pad2(abs % 60)}`}`;
}

// An address's since / until as a datetime-local field shows it (this browser's time); an older link's value
// without a zone was typed in local time and is shown as it is (and read so, as before).
// An address's since / until as written: a "+01:00" typed into a link by hand arrives as " 01:00" (a "+" in a
// query is a space), read as the offset it was.
export const instantParam = (value) => (value ? String(value).replace(/ (\d\d:?\d\d)$/, "+$1") : value);

// A filter's value for the address: since / until with their offset (withOffset), the others as they are.
const zoned = (key, value) => (key === "since" || key === "until" ? withOffset(value) : value);

export function localField(raw) {
  const value = instantParam(raw);
  if (!value) return "";
  if (!/(Z|[+-]\d\d:?\d\d)$/i.test(value)) return value;
  const d = new Date(value);
  if (Number.isNaN(d.getTime())) return "";
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}T${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

// ------------------------------------------------------------------ reasons, as people say them
// The machine reasons events and deliveries carry ("agent_action", "unknown_addressee", ...), in words; the raw
// value stays in the tooltip (title) and in data-reason. One not listed here (a newer service's) is shown as it
// is, its underscores as spaces.
export const REASON_LABELS = {
  "run.resumed": {
    answer: "a person answered",
    expiry: "nobody answered in time",
    rejection: "the question could not be asked",
    recovery: "recovered after a restart",
    agent_action: "the agent acted on its turn",
  },
  "run.failed": {
    compute_timeout: "the run took too long",
    conversation_too_large: "its conversation grew too large to keep",
    human_request_expired: "nobody answered in time",
    infrastructure_error: "an infrastructure error",
    malformed_tool_calls: "the model's tool calls were malformed",
    max_turns: "it reached its turn limit",
    output_truncated: "the model's reply was cut off at its output limit",
    provider_error: "the model provider failed",
    stalled: "the run stalled",
    token_limit: "it reached its token limit",
    unknown_agent: "no such agent",
  },
  "human.rejected": {
    recipient_not_allowed: "the agent may not ask this person",
    unknown_recipient: "no such person or group",
    no_channel: "no channel reaches them",
    invalid_request: "the request was invalid",
    intake_failed: "human-interaction could not take the question in",
  },
  "human.notification_failed": {
    recipient_not_allowed: "the agent may not notify this person",
    unknown_recipient: "no such person or group",
    no_channel: "no channel reached them",
    failed: "human-interaction failed",
  },
  "human.answer_refused": {
    already_answered: "already answered",
    expired: "the question had expired",
    cancelled: "the question was cancelled",
    not_recipient: "not asked of this person",
  },
  "agent.ask_undeliverable": {
    invalid_address: "not a valid address",
    unknown_addressee: "no such agent or run",
    self_addressed: "an agent cannot ask itself",
    asker_unknown: "the asking run is unknown",
    relay_failed: "the relay run could not start or ended without answering",
    routing_failed: "agent-collab could not route the ask",
  },
  "agent.reply_undeliverable": {
    unknown_request: "no such request",
    not_received: "the request never arrived",
    already_answered: "already answered",
    asker_finished: "the asking run has finished",
    request_closed: "the request is closed",
  },
  delivery: {
    duplicate: "a duplicate delivery",
    unsupported_event: "an event the trigger does not take",
    disabled: "the trigger is disabled",
    invalid_payload: "the payload was invalid",
    missed_tick: "a missed schedule tick",
    loop_limit: "the trigger's own run caused it (loop limit)",
    concurrency_skip: "a run of the same key was active",
    debounced: "a newer event replaced it (debounce)",
    filtered: "the trigger's condition did not match",
    launch_lost: "its stored launch was gone when its turn came (re-drive it)",
  },
};

export function reasonLabel(kind, value) {
  if (value === null || value === undefined || value === "") return "";
  const raw = String(value);
  const known = REASON_LABELS[kind];
  return known && Object.hasOwn(known, raw) ? known[raw] : raw.replaceAll("_", " ");
}

// A reason as a node: its label, the raw value in the tooltip and data-reason; null without one.
function reason(kind, value) {
  if (value === null || value === undefined || value === "") return null;
  const raw = String(value);
  return h("span", { class: "reason", title: raw, dataset: { reason: raw } }, reasonLabel(kind, raw));
}

// A run title or a grouped question exactly CUT_AT characters long was most likely cut there by a service (the
// gateway cuts titles, the analytics its questions), mid-word: it ends at the last word boundary when one is
// near, with "…". A shorter or longer text is whole.
const CUT_AT = 200;
export function uncut(text) {
  const value = String(text ?? "");
  if (value.length !== CUT_AT || value.endsWith("…")) return value;
  const space = value.lastIndexOf(" ");
  const end = space >= CUT_AT - 40 ? space : value.length;
  return `${value.slice(0, end).trimEnd()}…`;
}

const runTitle = (run) => (run.title ? uncut(run.title) : run.run_id);

function stateBadge(state) {
  return h("span", { class: `state state-${state}`, dataset: { state } }, state.replaceAll("_", " "));
}

function person(recipient) {
  return recipient ? recipient.replace(/^user:/, "") : "—";
}

// Who answered: the display name human-interaction's directory had for them (human.answered's
// responder_display_name), with the id after it; the id alone for an answer without one (older events).
function responderOf(responder, displayName) {
  const id = person(responder);
  return displayName && displayName !== id ? `${displayName} (${id})` : id;
}

// The asking agent: its card's display name (human.requested's agent_display_name) with its id, or the id alone.
function agentOf(agent, displayName) {
  return displayName && displayName !== agent ? `${displayName} (${agent})` : agent;
}

function facts(pairs) {
  const dl = h("dl", { class: "facts" });
  for (const [label, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    dl.append(h("dt", {}, label), h("dd", {}, value));
  }
  return dl;
}

// An id or an event type ("git.pullrequest.created", "dlv-0f3a…"): may break after a dot, a dash, an underscore,
// a slash, a colon or a comma (a <wbr>), never inside a word; its text is unchanged (td.ids keeps its words whole).
function idText(value) {
  const text = String(value ?? "");
  return text.split(/(?<=[.\-_/:,])/).flatMap((part, i) => (i ? [h("wbr"), part] : [part]));
}

// ------------------------------------------------------------------ the API
class ApiError extends Error {
  constructor(status, body, path = null) {
    super(body?.detail || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error || "http_error";
    this.body = body;
    this.path = path; // the call's path: a proxied service's answer (/gateway/...) is not the journal's
  }
}

// No answer from the journal: within API_TIMEOUT_MS (``silent``: it is up but stuck, or the network holds the
// request), or no connection at all (``silent`` false: it is down or restarting, the network is gone).
const API_TIMEOUT_MS = 15_000;
class NoAnswer extends Error {
  constructor(path, method, silent) {
    super(silent ? `no answer within ${API_TIMEOUT_MS / 1000} s` : "no connection");
    this.name = "NoAnswer";
    this.path = path;
    this.method = method;
    this.silent = silent;
  }
}

// The services the journal forwards to (their 401 is theirs, not the journal's: it signs nobody out)
const PROXIED = [["/gateway/", "the trigger-gateway"]];
const proxiedBy = (path) => PROXIED.find(([prefix]) => String(path ?? "").startsWith(prefix))?.[1] ?? null;

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// The headers of a call: the token as a Bearer when there is one (else the session cookie speaks).
function bearer(credential) {
  return credential ? { ...CONSOLE_HEADER, Authorization: `Bearer ${credential}` } : { ...CONSOLE_HEADER };
}

// The parsed JSON body and the ETag (for a later If-Match) of one API call; throws ApiError for a non-2xx.
// Every call gives up after API_TIMEOUT_MS (a stuck journal: NoAnswer, silent) -- a setTimeout, not
// AbortSignal.timeout, so that a test's clock (Playwright's page.clock) moves it; the view's ``signal`` aborts it too.
async function apiWithEtag(path, { method = "GET", body, signal, tokenOverride, ifMatch } = {}) {
  const headers = bearer(tokenOverride ?? token());
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch) headers["If-Match"] = ifMatch;
  const call = new AbortController();
  let silent = false;
  const timer = setTimeout(() => {
    silent = true;
    call.abort();
  }, API_TIMEOUT_MS);
  const abort = () => call.abort(signal.reason);
  if (signal?.aborted) abort();
  signal?.addEventListener("abort", abort);
  let response;
  let parsed = null;
  try {
    try {
      response = await fetch(path, {
        method,
        headers,
        signal: call.signal,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (error) {
      if (silent) throw new NoAnswer(path, method, true);
      if (signal?.aborted || error?.name === "AbortError") throw error;
      throw new NoAnswer(path, method, false);
    }
    try {
      parsed = await response.json();
    } catch {
      if (silent) throw new NoAnswer(path, method, true); // the body stopped coming
      parsed = null;
    }
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", abort);
  }
  journalAnswered();
  if (!response.ok) throw new ApiError(response.status, parsed, path);
  return { data: parsed, etag: response.headers.get("ETag") };
}

async function api(path, options = {}) {
  return (await apiWithEtag(path, options)).data;
}

// A 401 of the journal signs out: a person's session that ended (signed out in another tab, expired, changed in
// the directory) says "sign in again" and comes back to this page after the sign-in; a token that is not valid
// says so. A 401 of a service the journal forwards to (the trigger-gateway behind /gateway/, which may not have
// loaded a new token yet) signs nobody out: /whoami tells whether the journal still takes the sign-in, and the
// refusal is said in ``where`` (the section that asked) or on the message line. A 403 explains the role; no
// answer says so in words (and asks /readyz); anything else is shown as is.
function failed(error, where = null) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401 && proxiedBy(error.path)) {
    proxiedRefused(error, where);
  } else if (error instanceof NoAnswer) {
    noAnswer(error);
  } else if (error instanceof ApiError && error.status === 401 && (signedInPerson() || error.code === "session_ended")) {
    signOut(SESSION_ENDED, { stay: true });
  } else if (error instanceof ApiError && error.status === 401) {
    signOut(`Not signed in: ${error.message} (401). Sign in with a valid API token.`);
  } else if (error instanceof ApiError && error.status === 403) {
    message(`Not allowed: ${error.message} (403).`);
  } else if (error instanceof ApiError) {
    message(`${error.message} (${error.status} ${error.code}).`);
  } else {
    message(`Something went wrong in this page: ${error?.message || error}.`);
  }
}

// A proxied service's 401: the journal asked whether it still takes this sign-in (it does: said where it
// happened, nobody signed out; it does not: its own 401 signs out as usual).
async function proxiedRefused(error, where) {
  try {
    await api("/whoami");
  } catch (journal) {
    if (journal instanceof ApiError && journal.status === 401) return failed(journal);
    // the journal not answering now: the refusal is still the service's
  }
  const what = signedInPerson() ? "your sign-in" : "this token";
  const text = `${proxiedBy(error.path).replace(/^./, (c) => c.toUpperCase())} does not accept ${what} (yet): ` +
    `${error.message} (401). You are still signed in to the journal; a token added recently reaches the ` +
    "trigger-gateway with its next restart or rollout. Try again later.";
  if (where) sectionProblem(where, text);
  else message(text);
}

// A section's own problem line (a proxied service refused, or did not answer), above what it shows; gone at its
// next good read (sectionProblem(where, null)).
function sectionProblem(where, text) {
  let line = where.querySelector(":scope > .section-problem");
  if (!text) return line?.remove();
  if (!line) {
    line = h("p", { class: "section-problem bad", role: "alert" });
    where.prepend(line);
  }
  line.textContent = text;
}

// The journal did not answer: said for people, with what it means for the page or the action; a read's message
// goes by itself at the next call the journal answers (journalAnswered). /readyz is asked at once (the banner).
function noAnswer(error) {
  const action = error.method && error.method !== "GET";
  const why = error.silent
    ? `The journal did not answer within ${API_TIMEOUT_MS / 1000} s (it may be overloaded or stuck)`
    : "The journal cannot be reached (it may be restarting, or the network is down)";
  message(action
    ? `${why}: it is not known whether this was done. Look again once the journal answers (the page says when).`
    : `${why}: what you see may be out of date. The page reads it again by itself once the journal is back.`);
  if (!action) $("message").dataset.transient = "no-answer";
  checkJournal();
}

// A call the journal answered: a message that said it did not answer (a read's) is out of date now.
function journalAnswered() {
  const box = $("message");
  if (box.dataset.transient === "no-answer" && !box.hidden) message(null);
}

// ------------------------------------------------------------------ live tail (SSE over fetch)
// EventSource cannot send an Authorization header, so the stream is read with fetch() and parsed here;
// on a drop it reconnects with Last-Event-ID (the last cursor seen: an event's commit_seq, opaque).
// The badge says what the page's tail is doing: "live" (connected), "connecting…" (opening or reopening it),
// "offline" (refused), and "not live" while the journal says it is not ready (its bus lost: the banner,
// below, says so -- the stream is open but nothing new reaches the journal); a page without a tail (the wizard,
// sign-in, the inbox) hides it.
let tailState = "off";
function setLive(state) {
  const on = state === true || state === "on";
  tailState = on ? "on" : state === "connecting" ? "connecting" : "off";
  renderLive();
}

function renderLive() {
  const badge = $("live");
  const value = journalTrouble && tailState !== "off" ? "stale" : tailState;
  badge.dataset.live = value;
  document.body.dataset.live = value; // a page's own live marks (the Audit page's dot) follow the badge
  badge.textContent = { on: "live", connecting: "connecting…", off: "offline", stale: "not live" }[value];
  badge.title = value === "stale"
    ? "Not live: the journal is not receiving events (see the banner above the page)"
    : "Live updates (Server-Sent Events)";
}

// The current view's tail, to reopen it when the journal is back (see checkJournal): a resolver called once the
// stream is open again (its onOpen has asked the view to re-read), and the way to drop the stream now.
let reopenTail = null;

// The tail of the current view: onEvent for each event; onOpen each time the stream is (re)opened, after
// its start position is fixed -- a list view re-reads then, so nothing committed between its first read and
// the tail's start (or while it was away) is missed.
// The journal sends an idle stream ": ping" every 15 s (tail.py's KEEPALIVE_S): a stream silent for longer than
// TAIL_SILENT_MS -- more than two pings missed -- is not live (a stuck journal, a network holding the connection):
// it is dropped and opened again, and /readyz is asked (which says so in the banner when it does not answer).
const TAIL_SILENT_MS = 40_000;
const TAIL_WATCH_MS = 5_000;

async function tail(params, onEvent, signal, onOpen = null) {
  let lastId = null;
  let heard = Date.now(); // the stream's last word (an event, a ping), or when it was (re)opened
  const watchdog = setInterval(() => {
    if (Date.now() - heard <= TAIL_SILENT_MS) return;
    heard = Date.now();
    stream?.abort();
  }, TAIL_WATCH_MS);
  signal.addEventListener("abort", () => clearInterval(watchdog));
  let reopened = []; // resolvers of reopenTail() calls waiting for the stream to open again
  let stream = null; // this connection's AbortController (the view's signal aborts it too)
  let now = false; // reopen without the back-off pause (asked, not failed)
  const reopen = () => new Promise((resolve) => {
    reopened.push(resolve);
    now = true;
    stream?.abort();
  });
  reopenTail = reopen;
  signal.addEventListener("abort", () => {
    if (reopenTail === reopen) reopenTail = null;
    for (const resolve of reopened) resolve();
  });
  $("live").hidden = false;
  setLive("connecting");
  while (!signal.aborted) {
    now = false;
    stream = new AbortController();
    const abort = () => stream.abort();
    signal.addEventListener("abort", abort);
    heard = Date.now();
    try {
      const headers = bearer(token());
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined));
      const response = await fetch(`/events/stream?${query}`, { headers, signal: stream.signal });
      if (!response.ok) {
        let body = null;
        try {
          body = await response.json();
        } catch {
          body = null;
        }
        throw new ApiError(response.status, body);
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        heard = Date.now();
        buffer += value.replaceAll("\r\n", "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const item = parseBlock(block);
          if (item.comment !== null && item.comment.startsWith("tail after")) {
            setLive("on");
            onOpen?.();
            for (const resolve of reopened) resolve();
            reopened = [];
          }
          if (item.data === null) continue;
          if (item.id !== null) lastId = item.id;
          onEvent(JSON.parse(item.data));
        }
      }
    } catch (error) {
      if (signal.aborted) break;
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
        setLive(false);
        failed(error);
        return;
      }
    } finally {
      signal.removeEventListener("abort", abort);
    }
    if (signal.aborted) break;
    setLive("connecting");
    if (now) {
      now = false;
      continue;
    }
    checkJournal(); // the stream dropped: perhaps the journal is not ready (its answer may explain it)
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// ------------------------------------------------------------------ the journal's state (its bus)
// The live tail stays open while the journal has lost NATS: it is served from the journal's database, so the page
// would look live while nothing new arrives and actions (cancel, rerun, answering) fail with 503. The console
// therefore asks the journal's /readyz (no token needed) every JOURNAL_CHECK_MS, when a stream drops and when the
// tab is shown again: a 503 shows the banner (the bus lost, or whatever else /readyz names) and the badge reads
// "not live"; once it answers 200 again, the view's tail reopens (a list re-reads what it shows, a run's timeline
// gets what it missed), then the banner goes.
const JOURNAL_CHECK_MS = 10_000;
let journalTrouble = null; // {since, text} while the journal says it is not ready
// {pending, text} while the journal is ready but more events than its backlog.warn_above are not recorded yet (its
// /readyz "backlog": the durable consumer's count, read at most every 5 s): a banner, not a "not live" badge
let journalBehind = null;
let journalChecking = null; // the check under way (one at a time)
let viewFailed = false; // the current view's first read got no answer: opened again when the journal is back

function hhmm(date) {
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", timeZoneName: "short" });
}

const READYZ_TIMEOUT_MS = 5_000;

function troubleText(body, since, silent = null) {
  const stale = "what you see may be out of date, and actions may fail until it is back.";
  if (silent !== null) {
    return silent
      ? `The journal does not answer since ${hhmm(since)} (it may be overloaded or stuck): ${stale}`
      : `The journal cannot be reached since ${hhmm(since)} (it may be restarting, or the network is down): ${stale}`;
  }
  if (body?.nats === "disconnected") {
    return `The journal has lost its connection to the message bus since ${hhmm(since)}: ${stale}`;
  }
  const why = typeof body?.detail === "string" && body.detail ? ` (${body.detail})` : "";
  return `The journal is not ready since ${hhmm(since)}${why}: ${stale}`;
}

function behindFrom(body) {
  const backlog = body?.backlog;
  if (!backlog || !Number.isInteger(backlog.pending) || !Number.isInteger(backlog.warn_above)) return null;
  if (backlog.pending <= backlog.warn_above) return null;
  const count = backlog.pending.toLocaleString();
  return {
    pending: backlog.pending,
    text: `The journal is recording ${count} events behind the bus: the newest runs and events may not show yet.`,
  };
}

function renderTrouble() {
  const banner = $("journal-state");
  const shown = journalTrouble ?? journalBehind;
  if (!shown) {
    banner.hidden = true;
    delete banner.dataset.state;
    return;
  }
  const text = $("journal-state-text");
  if (text.textContent !== shown.text) text.textContent = shown.text; // unchanged: not announced again
  banner.dataset.state = !journalTrouble
    ? "behind"
    : journalTrouble.noAnswer
      ? "no-answer"
      : journalTrouble.bus
        ? "bus-lost"
        : "not-ready";
  banner.hidden = false;
}

function checkJournal() {
  journalChecking ??= (async () => {
    let response;
    let body = null;
    const call = new AbortController();
    let silent = false;
    const timer = setTimeout(() => {
      silent = true;
      call.abort();
    }, READYZ_TIMEOUT_MS);
    try {
      response = await fetch("/readyz", { cache: "no-store", headers: { Accept: "application/json" }, signal: call.signal });
      body = await response.json().catch(() => null);
    } catch {
      // no answer within READYZ_TIMEOUT_MS (stuck), or no connection (down, restarting): the banner says which
      const since = journalTrouble?.since ?? new Date();
      journalTrouble = { since, noAnswer: true, text: troubleText(null, since, silent) };
      renderTrouble();
      renderLive();
      return;
    } finally {
      clearTimeout(timer);
    }
    if (response.ok) {
      const behind = behindFrom(body);
      if (behind?.text !== journalBehind?.text) {
        journalBehind = behind;
        if (!journalTrouble) renderTrouble();
      }
      if (!journalTrouble || journalTrouble.recovering) return;
      journalTrouble.recovering = true;
      // back: the view re-reads what it shows (its tail reopens; a view whose first read got no answer is opened
      // again), then the banner goes
      if (viewFailed) route();
      const caughtUp = reopenTail ? reopenTail() : Promise.resolve();
      await Promise.race([caughtUp, new Promise((resolve) => setTimeout(resolve, 10_000))]);
      journalTrouble = null;
    } else if (response.status === 503) {
      const since = journalTrouble?.since ?? new Date();
      journalTrouble = { since, bus: body?.nats === "disconnected", text: troubleText(body, since) };
    } else {
      return;
    }
    renderTrouble();
    renderLive();
  })().finally(() => {
    journalChecking = null;
  });
  return journalChecking;
}

function parseBlock(block) {
  const item = { id: null, event: null, data: null, comment: null };
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) {
      item.comment = line.slice(1).trim();
      continue;
    }
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (name === "data") data.push(value);
    else if (name === "id") item.id = value;
    else if (name === "event") item.event = value;
  }
  if (data.length) item.data = data.join("\n");
  return item;
}

// A page's refresh on events: `wait` ms after the last call, but no later than `maxWait` ms after the first call not
// served yet -- a steady stream of events (each within `wait` of the last) still refreshes the page every `maxWait`
// ms instead of never. One refresh at a time: a call while one runs (fn may return a promise) is served by one more
// refresh after it, so a slow API is not asked again before it answered.
function debounce(fn, wait, maxWait = 2000) {
  let timer = null;
  let first = null; // when the oldest call not served yet came
  let running = false;
  let again = false;
  const fire = async () => {
    timer = null;
    first = null;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } finally {
      running = false;
      if (again) {
        again = false;
        call();
      }
    }
  };
  const call = () => {
    const now = Date.now();
    first ??= now;
    clearTimeout(timer);
    timer = setTimeout(fire, Math.max(0, Math.min(wait, first + maxWait - now)));
  };
  return call;
}

// ------------------------------------------------------------------ sign-in
// Signed in with the provider: the journal ends its session and, when the provider offers it (RP-initiated
// logout), the browser goes on to the provider, which signs the person out there too and sends them back here.
// A person's session ends on the server before the sign-in page shows: that page asks /whoami, and asked while the
// logout is still on its way it would find the session open and sign the person straight back in.
// ``stay``: the sign-in shows on this page's route, and the console comes back here once signed in again.
function signOut(reason, { stay = false } = {}) {
  sessionStorage.removeItem(TOKEN_KEY);
  const here = location.hash && !location.hash.startsWith("#/signin") ? location.hash : "#/runs";
  const signedOut = () => {
    me = null;
    renderChrome();
    go(stay ? here : "#/signin", reason);
  };
  if (!signedInPerson()) return signedOut();
  fetch("/auth/logout", { method: "POST", headers: CONSOLE_HEADER })
    .then(async (response) => {
      if (response.ok || response.status === 401) { // ended now, or already (expired, revoked)
        const body = response.ok ? await response.json().catch(() => null) : null;
        if (body?.provider_logout) return location.assign(body.provider_logout);
        return signedOut();
      }
      // e.g. 503 sign_out_unrecorded: the session was not ended, say so rather than look signed out
      const refused = await response.json().catch(() => null);
      message(`Not signed out: ${refused?.detail ?? `HTTP ${response.status}`}`);
    })
    .catch((error) => message(`Not signed out: ${error.message}`));
}

// The person signed in with the provider (the session cookie), or null; asked when no token is kept here.
async function sessionPerson(signal) {
  try {
    const who = await api("/whoami", { signal });
    return who?.kind === "person" ? who : null;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return null;
    throw error;
  }
}

async function loadAuthConfig() {
  if (authConfig === null) {
    try {
      authConfig = await api("/auth/config");
    } catch {
      authConfig = { oidc: null, password: null };
    }
  }
  return authConfig;
}

// "Sign in with <provider>" when the journal has OIDC configured (GET /auth/config), else nothing.
async function providerButton() {
  const oidc = (await loadAuthConfig()).oidc;
  if (!oidc) return null;
  const back = location.hash && !location.hash.startsWith("#/signin") ? location.hash : "#/runs";
  return h(
    "p",
    { class: "provider" },
    h("a", { class: "button primary", id: "provider-sign-in", href: `${oidc.login}?next=${encodeURIComponent(back)}` },
      `Sign in with ${oidc.provider}`),
  );
}

// Show ``hash`` (re-rendering when it is the current one) with ``text`` as its message (``kind`` as message()).
function go(hash, text = null, kind = "error") {
  pendingMessage = text ? { text, kind } : null;
  if (location.hash !== hash) location.hash = hash;
  else {
    showPending();
    route();
  }
}

function showPending() {
  message(pendingMessage?.text ?? null, pendingMessage?.kind);
  pendingMessage = null;
}

// "Sign in with your directory account" when the journal has password sign-in on (GET /auth/config), else
// null: the person's directory user id and console password, checked by human-interaction; the journal sets its
// session cookie (HttpOnly: nothing is kept in this tab) with the role the directory gives them.
async function directoryForm() {
  const config = (await loadAuthConfig()).password;
  if (!config) return null;
  const user = h("input", { id: "directory-user", name: "username", autocomplete: "username", required: true,
    maxlength: 200, spellcheck: "false", autocapitalize: "none" });
  const password = h("input", { id: "directory-password", name: "password", type: "password",
    autocomplete: "current-password", required: true, maxlength: 1024, "aria-describedby": "directory-help" });
  const submit = h("button", { class: "primary", type: "submit" }, "Sign in with your directory account");
  const form = h(
    "form",
    { class: "signin card", id: "directory-signin" },
    h("h2", {}, "Sign in with your directory account"),
    h("label", { for: "directory-user" }, "User id", user),
    h("label", { for: "directory-password" }, "Password", password),
    h("p", { id: "directory-help", class: "muted" },
      "Your user id in the Temporality directory and the console password an admin set for you."),
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      const response = await fetch(config.login, {
        method: "POST",
        headers: { ...CONSOLE_HEADER, "Content-Type": "application/json" },
        body: JSON.stringify({ user: user.value.trim(), password: password.value }),
      }).catch((error) => {
        throw Object.assign(error, { signInUnreachable: true }); // no connection (a refusal is an answer)
      });
      const body = await response.json().catch(() => null);
      if (!response.ok) {
        const wait = response.headers.get("Retry-After");
        const detail = body?.detail ?? `HTTP ${response.status}`;
        message(response.status === 401
          ? "Not signed in: unknown user or wrong password."
          : `Not signed in: ${detail}${wait && !detail.includes(" s") ? ` (retry in ${wait} s)` : ""}.`);
        password.value = "";
        password.focus();
        return;
      }
      password.value = "";
      sessionStorage.removeItem(TOKEN_KEY); // the session cookie speaks from now on
      me = await sessionPerson();
      renderChrome();
      const back = location.hash && !location.hash.startsWith("#/signin") && location.hash !== "#/inbox"
        ? location.hash : null;
      go(me?.role ? back ?? body.next : "#/inbox");
    } catch (error) {
      if (error?.signInUnreachable) {
        message("Not signed in: the journal cannot be reached (it may be restarting, or the network is down). Try again.");
      } else failed(error);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function signInView() {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    minlength: 1,
    "aria-describedby": "token-help",
  });
  const form = h(
    "form",
    { class: "signin card", id: "signin" },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "API token", input),
    h(
      "p",
      { id: "token-help", class: "muted" },
      "A viewer, operator or admin token from TEMPORALITY_API_TOKENS_FILE (temporality up prints one). " +
        "It is kept in this browser tab only.",
    ),
    h("button", { class: "primary", type: "submit" }, "Sign in"),
    h("p", { class: "muted" }, "Here to answer a question an agent asked you? ",
      h("a", { href: "#/inbox" }, "Open your inbox"), " (with your inbox token)."),
  );
  const page = h("div", { class: "signin-page" }, form);
  Promise.all([providerButton(), directoryForm()]).then(([button, directory]) => {
    if (directory) {
      form.querySelector("h1").remove();
      page.prepend(h("h1", {}, "Sign in"), directory, h("p", { class: "muted" }, "Or with an API token:"));
      if (document.activeElement === input && !input.value) $("directory-user").focus();
    }
    if (button) page.querySelector("h1").after(button, h("p", { class: "muted" }, directory ? "Or:" : "Or with an API token:"));
  }).catch(() => {});
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    try {
      me = await api("/whoami", { tokenOverride: candidate });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        message(`That token was refused: ${error.message} (401).`);
      } else failed(error);
      input.select();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, candidate);
    renderChrome();
    go(location.hash && location.hash !== "#/signin" ? location.hash : "#/runs");
  });
  show(page);
  input.focus();
}

function renderChrome(active) {
  $("nav").hidden = !me?.role; // a person with no role has only their inbox
  for (const link of document.querySelectorAll("[data-needs=operator]")) link.hidden = !mayOperate();
  $("sign-out").hidden = !me;
  $("who").textContent = me ? `${me.name} (${me.role ?? "inbox only"})` : "";
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

const mayOperate = () => me && ROLES[me.role] >= ROLES.operator;
const mayAdmin = () => me && ROLES[me.role] >= ROLES.admin;

// ------------------------------------------------------------------ runs list
function runsView(signal, query) {
  const params = new URLSearchParams(query);
  const field = (name, label, attrs = {}) => h("label", {}, label, h("input", { name, ...attrs,
    value: attrs.type === "datetime-local" ? localField(params.get(name)) : params.get(name) ?? "" }));
  const state = h(
    "select",
    { name: "state" },
    h("option", { value: "" }, "any"),
    STATES.map((s) => h("option", { value: s, selected: params.get("state") === s }, s.replaceAll("_", " "))),
  );
  const form = h(
    "form",
    { class: "filters", id: "run-filters" },
    h("label", {}, "State", state),
    field("agent", "Agent"),
    field("trigger_id", "Trigger"),
    field("q", "Title or run id", { title: "A part of the title, or the start of the run id" }),
    field("since", "Created since", { type: "datetime-local" }),
    field("until", "Created before", { type: "datetime-local" }),
    h("button", { type: "submit" }, "Filter"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value) next.set(key, zoned(key, value));
    location.hash = `#/runs${next.size ? `?${next}` : ""}`;
  });
  const body = h("tbody");
  const more = h("button", { type: "button", hidden: true }, "Older runs");
  const table = h(
    "table",
    { id: "runs" },
    h(
      "thead",
      {},
      h("tr", {}, h("th", {}, "Run"), h("th", {}, "State"), h("th", {}, "Agent"), h("th", {}, "Trigger"),
        h("th", {}, "Waiting for"), h("th", {}, "Created")),
    ),
    body,
  );
  show(h("h1", {}, "Runs"), form, table, more);

  const load = pagedList({
    path: "/runs", filters: ["state", "agent", "trigger_id", "q"], params, signal, body, more,
    items: (data) => data.runs, row: runRow, columns: 6, empty: "No runs.",
    key: (run) => run.run_id, position: (run) => listPosition(run.created_at, run.run_id),
  });
  // a change re-reads the rows shown, the older pages loaded included (a new run on top, a changed one changed)
  const refresh = debounce(() => load.refresh().catch(failed), 1000);
  tail({}, (event) => (event.run_id ? refresh() : null), signal, refresh);
}

// A table's one row while it loads, and once its first read failed (the message line says why).
const loadingRow = (columns) => h("tr", { class: "loading" }, h("td", { colspan: columns, class: "empty", "aria-busy": "true" },
  "Loading…"));
const notLoadedRow = (columns) => h("tr", { class: "not-loaded" }, h("td", { colspan: columns, class: "empty" },
  "Not loaded (see above why)."));

// A list page's rows from a paged API (`next_before` cursors; the gateway's `next_cursor` with `cursorParam` /
// `nextCursor`): the page's filters from the address (`filters` as they are; `since` / `until`, with their offset or (older links) in local
// time, as ISO instants), `pageSize` rows at a time, "Older" (`more`) for the next page. Loads the first page;
// returns load(reset) for a refresh. With `key` (an item's id), load.newer() reads the first page again and puts
// the items not shown yet on top (a live list that keeps its older pages), resolving to them. With `key` and
// `position` (an item's place in the list's order, newest first: [instant, id]), load.refresh() reads again
// everything down to the oldest row shown -- new rows on top, changed ones changed, the older pages loaded kept.
// `prepare(items)` sees every item loaded before their rows are made (a row may depend on the others).
function pagedList({ path, filters = [], params = new URLSearchParams(), signal, body, more, items, row, columns,
  empty, key = null, position = null, cursorParam = "before", nextCursor = (data) => data.next_before,
  pageSize = 50, maxLimit = 1000, prepare = null, onError = failed, onLoaded = null }) {
  const apiParams = new URLSearchParams();
  for (const name of filters) if (params.get(name)) apiParams.set(name, params.get(name));
  for (const name of ["since", "until"]) {
    const local = instantParam(params.get(name));
    if (local && !Number.isNaN(Date.parse(local))) apiParams.set(name, new Date(local).toISOString());
  }
  apiParams.set("limit", String(pageSize));
  let before = null;
  const shown = new Set();
  let loaded = []; // the items shown, in order (with `key`)
  const emptyRow = () => h("tr", {}, h("td", { colspan: columns, class: "empty" }, empty));
  // until the first page came: "Loading…" (a journal that does not answer is not an empty list), then why not
  let first = true;
  body.replaceChildren(loadingRow(columns));
  const setMore = () => { more.hidden = !before; };
  // one read at a time, in the order asked: "Older" pressed while a live refresh reads waits for it (and reads
  // after the rows it left), instead of both writing the rows and the cursor in whichever order they answer
  let queue = Promise.resolve();
  const serial = (fn) => (...args) => {
    const run = queue.then(() => fn(...args));
    queue = run.catch(() => {});
    return run;
  };
  async function loadPage(reset) {
    const page = new URLSearchParams(apiParams);
    if (!reset && before) page.set(cursorParam, before);
    const data = await api(`${path}?${page}`, { signal });
    first = false;
    onLoaded?.();
    if (reset) {
      body.replaceChildren();
      shown.clear();
      loaded = [];
    }
    const fresh = key ? items(data).filter((item) => !shown.has(key(item))) : items(data);
    loaded.push(...fresh);
    prepare?.(loaded);
    for (const item of fresh) {
      if (key) shown.add(key(item));
      body.append(row(item));
    }
    if (reset && !items(data).length) body.append(emptyRow());
    before = nextCursor(data);
    setMore();
  }
  const load = serial(loadPage);
  load.newer = serial(async () => {
    const data = await api(`${path}?${apiParams}`, { signal });
    onLoaded?.();
    const fresh = items(data).filter((item) => !shown.has(key(item)));
    if (!fresh.length) return fresh;
    body.querySelector("td.empty")?.parentElement.remove();
    for (const old of body.querySelectorAll("tr.new")) old.classList.remove("new"); // "new" marks the latest ones
    const rows = fresh.map((item) => {
      shown.add(key(item));
      const node = row(item);
      node.classList.add("new");
      return node;
    });
    body.prepend(...rows);
    return fresh;
  });
  load.refresh = serial(async () => {
    if (!position || !key || loaded.length <= pageSize) return loadPage(true); // the first page only: read it again
    const oldest = position(loaded[loaded.length - 1]);
    const got = [];
    let cursor = null;
    for (let reads = 0; reads < 20; reads += 1) { // bounded: what was not read stays behind "Older"
      const page = new URLSearchParams(apiParams);
      page.set("limit", String(Math.min(maxLimit, loaded.length + pageSize)));
      if (cursor) page.set(cursorParam, cursor);
      const data = await api(`${path}?${page}`, { signal });
      onLoaded?.();
      const list = items(data);
      got.push(...list);
      cursor = nextCursor(data);
      if (!cursor || (list.length && comparePositions(position(list[list.length - 1]), oldest) <= 0)) break;
    }
    const kept = got.filter((item) => comparePositions(position(item), oldest) >= 0);
    // nothing older than the oldest row was read: go on after what was read (or nothing more); else the old
    // cursor (just after the oldest row shown) still is where the older rows start
    if (kept.length === got.length) before = cursor;
    shown.clear();
    loaded = kept.filter((item) => !shown.has(key(item)) && shown.add(key(item)));
    prepare?.(loaded);
    body.replaceChildren(...(loaded.length ? loaded.map(row) : [emptyRow()]));
    setMore();
  });
  more.addEventListener("click", () => load(false).catch(onError));
  load(true).catch((error) => {
    if (first && error?.name !== "AbortError") body.replaceChildren(notLoadedRow(columns));
    onError(error);
  });
  return load;
}

// An item's place in a list ordered newest first by (time, id), as the journal and the gateway order theirs: the
// instant in microseconds (ISO 8601 with up to six decimals; Date.parse keeps milliseconds) and the id.
export function listPosition(iso, id) {
  const ms = Date.parse(iso);
  const fraction = /T[^.]*\.(\d+)/.exec(String(iso ?? ""))?.[1] ?? "";
  return [Number.isNaN(ms) ? 0 : ms * 1000 + Number(`${fraction}000000`.slice(3, 6)), String(id ?? "")];
}

// < 0: ``a`` is older (further down the list) than ``b``; 0: the same place; > 0: newer.
export function comparePositions(a, b) {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  return a[1] === b[1] ? 0 : a[1] < b[1] ? -1 : 1;
}

// "rerun of <run>": a run an operator started again from an accepted delivery (the gateway's {"rerun": n})
function rerunMarker(run) {
  if (!run.rerun_of) return null;
  return h("div", { class: "rerun-of muted", title: run.rerun_requested_by ? `Rerun asked by ${run.rerun_requested_by}` : null },
    "rerun of ", h("a", { href: `#/runs/${encodeURIComponent(run.rerun_of)}`, "aria-label": `rerun of run ${run.rerun_of}` },
      shortRunId(run.rerun_of)));
}

function runRow(run) {
  return h(
    "tr",
    { dataset: { runId: run.run_id } },
    h("td", { class: "wide" }, h("a", { href: `#/runs/${encodeURIComponent(run.run_id)}` }, runTitle(run)),
      h("div", { class: "muted" }, run.run_id), rerunMarker(run)),
    h("td", {}, stateBadge(run.state)),
    h("td", {}, run.agent ?? "—"),
    h("td", {}, run.trigger_id ?? "—"),
    h("td", {}, run.waiting ? `${person(run.waiting.recipient)} · ${run.waiting.channel ?? "not notified yet"}` : ""),
    h("td", { class: "nowrap" }, when(run.created_at)),
  );
}

// RUN-1: a run's system prompt by its SHA-256, short ("sha256:3b5d0c1e9a7f", the whole digest on hover), and its
// sandbox in words (never its pass-through variables: run.started does not carry them)
function promptDigest(digest, id) {
  if (!digest) return null;
  return h("code", { id, class: "digest", title: `sha256:${digest}` }, `sha256:${digest.slice(0, 12)}`);
}
function sandboxSummary(sandbox) {
  if (!sandbox) return null;
  return [sandbox.kind || "process", sandbox.network ? "network on" : "network off",
    sandbox.working_dir_set ? "own working directory" : null].filter(Boolean).join(" · ");
}

// ------------------------------------------------------------------ run timeline (UI-1)
// One step per event, in stream order, plus a "Waiting …" step between a human request and its outcome
// (or up to now while the run still waits). Every step's event is one click away (details).
export function timeline(events, run, now = Date.now()) {
  const steps = [];
  const outcomes = new Map(); // request_id -> the first human.answered / expired / rejected / withdrawn
  const asks = new Map(); // request_id -> its human.requested (the question a human.withdrawn step quotes)
  for (const e of events) {
    const id = e.data?.request_id;
    if (!id) continue;
    if (["human.answered", "human.expired", "human.rejected", "human.withdrawn"].includes(e.type)) {
      if (!outcomes.has(id)) outcomes.set(id, e);
    } else if (e.type === "human.requested" && !asks.has(id)) asks.set(id, e);
  }
  // Deliveries with an outcome in the run: their trigger.received reads in that outcome's step ("Trigger …" when
  // accepted, "Duplicate delivery ignored" …), so a redelivered webhook is one step, not two raw ones.
  const settled = new Set(
    events.filter((e) => e.type === "trigger.accepted" || e.type === "trigger.rejected").map((e) => e.data?.delivery_id),
  );
  let triggered = false;
  const open = new Map(); // request_id -> its human.requested, while no outcome is journaled and the run goes on
  // In time order: a question's "Waited …" goes just before its outcome (after the notifications sent meanwhile);
  // the run's current wait ("Waiting …", up to now) after everything journaled.
  const waitedBefore = new Map(); // outcome event id -> its "Waited …" step
  let waitingNow = null;
  for (const e of events) {
    const d = e.data || {};
    const step = { kind: "", title: e.type, lines: [], event: e };
    if (waitedBefore.has(e.id)) {
      steps.push(waitedBefore.get(e.id));
      waitedBefore.delete(e.id);
    }
    if (e.type === "human.requested" && d.request_id && !outcomes.has(d.request_id)) open.set(d.request_id, e);
    if (RUN_ENDS[e.type] && open.size) {
      // The run ended with questions still open and no human.withdrawn journaled (history from before that event,
      // 2026-12-07): human-interaction withdrew them with the run, so the timeline says it after the end, derived.
      steps.push(endStep(step, e, d));
      for (const asked of open.values()) steps.push(withdrawnStep(asked, e));
      open.clear();
      continue;
    }
    switch (e.type) {
      case "trigger.received":
        if (settled.has(d.delivery_id)) continue; // its outcome's step says it
        step.title = `Delivery received: ${d.source_event_type ?? d.adapter}`;
        step.kind = "minor";
        step.lines = [["Delivery", d.delivery_id], ["Source event", d.source_event_id], ["Adapter", d.adapter]];
        break;
      case "trigger.rejected":
        step.title = d.reason === "duplicate" ? "Duplicate delivery ignored" : ["Delivery refused: ", reason("delivery", d.reason)];
        step.kind = "minor";
        step.lines = [["Delivery", d.delivery_id], ["Detail", d.detail]];
        break;
      case "trigger.accepted":
        triggered = true;
        step.title = `Trigger ${d.trigger_id}`;
        step.lines = [["Delivery", d.delivery_id], ["Source event", d.source_event_id], ["Agent", d.agent]];
        break;
      case "run.requested":
        step.title = triggered ? "Run requested" : `Trigger ${d.launch?.trigger_id ?? d.launch?.kind ?? ""}`.trim();
        step.lines = [["Title", d.title], ["Agent", d.agent], ["Launched by", d.launch?.kind],
          ["Source event", d.event?.type], ["Delivery", d.launch?.delivery_id],
          // a rerun of an accepted delivery (the gateway's {"rerun": n}): the run it runs again, and who asked
          ["Rerun of", d.launch?.rerun_of
            ? h("a", { href: `#/runs/${encodeURIComponent(d.launch.rerun_of)}` }, d.launch.rerun_of) : null],
          ["Rerun asked by", d.launch?.requested_by]];
        break;
      case "run.created":
        step.title = "Run created";
        step.kind = "minor";
        break;
      case "run.started": {
        step.title = "Run started";
        const card = d.agent_card || {};
        // RUN-1: what the run was started with; the prompt by its digest only (an admin reads it from the card)
        step.lines = [["Agent", d.agent], ["Role", d.role],
          ["Model", card.provider ? [card.provider, card.model].filter(Boolean).join(" · ") : null],
          ["Skills", (card.skills || []).join(", ")], ["MCP servers", (card.mcp_servers || []).join(", ")],
          ["Prompt", promptDigest(card.system_prompt_sha256)], ["Sandbox", sandboxSummary(card.sandbox)]];
        break;
      }
      case "run.tool_called":
        step.title = `Tool call: ${d.tool}`;
        step.lines = [["Turn", d.turn], ["Result", d.result_preview]];
        break;
      case "run.sampled":
        step.title = `Tool ${d.tool} asked the model (${d.model})`;
        step.kind = "minor";
        step.lines = [["Turn", d.turn], ["Prompt", d.prompt_preview], ["Answer", d.result_preview],
          ["Tokens", d.total_tokens || null]];
        break;
      case "tool.failed":
        step.title = `Tool failed: ${d.tool}`;
        step.kind = "bad";
        step.lines = [["Error", d.error]];
        break;
      case "run.checkpointed":
        step.title = `Checkpoint (turn ${d.turn})`;
        step.kind = "minor";
        break;
      case "human.requested": {
        step.title = "Human request";
        step.kind = "human";
        const options = (d.options || []).map((o) => o.label).join(" · ");
        // why the agent asks (ask_human's reason) and the kind of help, named as the inbox card names it
        const kind = d.reason_kind ? String(REASON_KINDS[d.reason_kind] ?? d.reason_kind) : "";
        step.lines = [["Question", d.question], ["Asked", person(d.recipient)],
          ["By agent", d.agent_display_name ? agentOf(d.agent, d.agent_display_name) : null],
          ["Why", d.reason], ["Kind", kind ? kind[0].toUpperCase() + kind.slice(1) : null], ["Context", d.context],
          ["Options", options], ["Timeout", duration(d.timeout_s)]];
        steps.push(step);
        const outcome = outcomes.get(d.request_id);
        const asked = Date.parse(e.time);
        if (outcome?.type === "human.withdrawn") {
          // its own step says how long it was open
        } else if (outcome) {
          const waited = outcome.data.waited_s ?? (Date.parse(outcome.time) - asked) / 1000;
          waitedBefore.set(outcome.id, { kind: "wait", title: `Waited ${duration(waited)}`, lines: [], event: null });
        } else if (run?.state === "waiting_for_human" && run.waiting?.request_id === d.request_id) {
          waitingNow = {
            kind: "wait",
            title: `Waiting ${duration((now - asked) / 1000)}`,
            lines: [["For", person(run.waiting.recipient)], ["Channel", run.waiting.channel]],
            event: null,
            live: true,
          };
        }
        continue;
      }
      case "human.notified":
        step.title = `Notified ${person(d.recipient)} on ${d.channel}`;
        step.kind = "minor";
        step.lines = [["Fallback from", d.fallback_from]];
        break;
      case "human.answered": {
        step.title = "Human response";
        step.kind = "human";
        const a = d.answer || {};
        const answer = a.type === "option" ? (a.label ? `${a.label} (${a.option_id})` : a.option_id) : a.value;
        step.lines = [["Answer", answer], ["By", responderOf(d.responder, d.responder_display_name)],
          ["Channel", d.channel]];
        break;
      }
      case "human.expired":
        step.title = "Nobody answered in time";
        step.kind = "bad";
        step.lines = [["Then", d.action === "default" ? `continued with ${d.default_answer?.option_id}` : "failed"]];
        break;
      case "human.rejected":
        step.title = "Human request refused";
        step.kind = "bad";
        step.lines = [["Reason", reason("human.rejected", d.reason)], ["Detail", d.detail]];
        break;
      case "human.withdrawn":
        withdrawnStep(asks.get(d.request_id), e, step);
        break;
      case "human.answer_refused":
        step.title = `Answer from ${person(d.responder)} refused`;
        step.kind = "bad";
        step.lines = [["Reason", reason("human.answer_refused", d.reason)], ["Channel", d.channel]];
        break;
      // An agent's notify (HUM-9): what it said, the channel that carried it to each person, or why nobody was told.
      case "human.notify_requested":
        step.title = `Notify ${person(d.recipient)}: ${clip(d.message)}`;
        step.kind = "human";
        step.lines = [["Title", d.title], ["Message", d.message]];
        break;
      case "human.notification_delivered":
        step.title = `Notification delivered to ${person(d.person)} on ${d.channel}`;
        step.kind = "minor";
        step.lines = [["For", d.recipient !== d.person ? person(d.recipient) : null], ["Fallback from", d.fallback_from],
          ["Failed first", attempts(d.failed_attempts)], ["Delivery", d.delivery > 1 ? `${d.delivery} (the earlier ones failed)` : null]];
        break;
      case "human.notification_failed":
        step.title = `Notification to ${person(d.recipient)} not delivered`;
        step.kind = "bad";
        step.lines = [["Reason", reason("human.notification_failed", d.reason)],
          ["Not told", (d.unreached || []).map(person).join(", ")], ["Tried", attempts(d.failed_attempts)],
          ["Deliveries", d.deliveries], ["Detail", d.detail]];
        break;
      case "run.resumed":
        step.title = "Run resumed";
        step.lines = [["Because", reason("run.resumed", d.reason)]];
        break;
      case "run.completed":
      case "run.failed":
      case "run.cancelled":
        endStep(step, e, d);
        break;
      // Agent collaboration (COL-9): who asked whom, the answer, and why a message went nowhere.
      case "agent.asked": {
        step.title = `Asked ${address(d.to)}: ${clip(d.message)}`;
        step.kind = "human";
        step.lines = [["Request", d.request_id], ["Mode", d.mode === "wait" ? `wait (${duration(d.timeout_s)})` : d.mode],
          ["Message", d.message], ["Truncated", d.truncated ? "yes" : null]];
        steps.push(step);
        if (run?.state === "waiting_for_agent" && run.waiting?.request_id === d.request_id) {
          steps.push({
            kind: "wait",
            title: `Waiting ${duration((now - Date.parse(e.time)) / 1000)}`,
            lines: [["For", address(d.to)]],
            event: null,
            live: true,
          });
        }
        continue;
      }
      case "agent.message.received":
        step.title = `Message from agent ${d.asker_agent}: ${clip(d.message)}`;
        step.kind = "human";
        step.lines = [["Request", d.request_id], ["From run", d.asker_run_id], ["Addressed as", d.to],
          ["Relay for", d.relay ? d.resolved_run_id : null], ["Answer by", d.expires_at ? when(d.expires_at) : null]];
        break;
      case "agent.replied":
        step.title = d.outcome === "refusal" ? `Refused request ${d.request_id}` : `Answered request ${d.request_id}`;
        step.lines = [["Answer", d.answer]];
        break;
      case "agent.answer.received":
        step.title = d.outcome === "refusal"
          ? `Refusal received from ${d.replier_agent}`
          : `Answer received from ${d.replier_agent}`;
        step.kind = d.outcome === "refusal" ? "bad" : "human";
        step.lines = [["Answer", d.answer], ["Request", d.request_id], ["Run", d.replier_run_id],
          ["Waited", duration(d.waited_s)], ["Late", d.late ? "yes (after the wait expired)" : null]];
        break;
      case "agent.ask_expired":
        step.title = `No answer from the agent within ${duration(d.timeout_s)}`;
        step.kind = "bad";
        step.lines = [["Request", d.request_id], ["Still open at", d.recipient_run_id]];
        break;
      case "agent.ask_undeliverable":
        step.title = ["Ask undeliverable: ", reason("agent.ask_undeliverable", d.reason)];
        step.kind = "bad";
        step.lines = [["To", d.to], ["Detail", d.detail], ["Request", d.request_id]];
        break;
      case "agent.reply_undeliverable":
        step.title = ["Reply undeliverable: ", reason("agent.reply_undeliverable", d.reason)];
        step.kind = "bad";
        step.lines = [["Detail", d.detail], ["Request", d.request_id]];
        break;
      // AP-9: what a run streams while it works -- a hosted run's run.streamed (report_progress, each turn's
      // metrics) and an external agent's agent.task.streamed carry the same payload and read the same.
      case "run.streamed":
      case "agent.task.streamed":
        streamedStep(step, d);
        break;
      case "run.cancel_requested":
        step.title = `Cancel requested by ${d.requested_by}`;
        step.kind = "bad";
        step.lines = [["Reason", d.reason]];
        break;
      default:
        break;
    }
    steps.push(step);
  }
  if (waitingNow) steps.push(waitingNow);
  return steps;
}

// A run's end, and what it means for a question still open then ("Question withdrawn: the run was cancelled").
const RUN_ENDS = { "run.completed": "the run completed", "run.failed": "the run failed", "run.cancelled": "the run was cancelled" };

function endStep(step, e, d) {
  if (e.type === "run.completed") {
    step.title = "Completed";
    step.kind = "done";
    step.lines = [["Result", d.result], ["Turns", d.turns]];
  } else if (e.type === "run.failed") {
    step.title = "Failed";
    step.kind = "bad";
    step.lines = [["Reason", reason("run.failed", d.reason)], ["Error", d.error]];
  } else {
    step.title = "Cancelled";
    step.kind = "bad";
    step.lines = [["Reason", d.reason]];
  }
  return step;
}

// Why human-interaction withdrew a question (human.withdrawn's reason), as the timeline says it.
const WITHDRAWN_BECAUSE = {
  run_completed: RUN_ENDS["run.completed"], run_failed: RUN_ENDS["run.failed"],
  run_cancelled: RUN_ENDS["run.cancelled"], not_needed: "another question was answered first",
};

// A question withdrawn: from its human.withdrawn (``event``: one click away, with the run's own reason), or, for
// history journaled before that event, derived from the run's end at read time (no event of its own). Either
// way: the question, whom, and how long it was open.
function withdrawnStep(asked, end, step = null) {
  const q = asked?.data || {};
  if (step) {
    const d = end.data || {};
    step.kind = "withdrawn";
    step.title = `Question withdrawn: ${WITHDRAWN_BECAUSE[d.reason] ?? d.reason}`;
    step.lines = [["Question", q.question], ["Asked", person(d.recipient)], ["Request", d.request_id],
      ["Channel", d.channel], ["Open for", duration(d.waited_s)],
      ["Run's reason", d.reason === "run_failed" ? reason("run.failed", d.run_reason) : d.run_reason]];
    return step;
  }
  return {
    kind: "withdrawn",
    type: "human.withdrawn",
    title: `Question withdrawn: ${RUN_ENDS[end.type]}`,
    lines: [["Question", q.question], ["Asked", person(q.recipient)], ["Request", q.request_id],
      ["Open for", duration((Date.parse(end.time) - Date.parse(asked.time)) / 1000)]],
    event: null,
    time: end.time,
  };
}

// The request a streamed turn works on (a relay run answering an ask): not said when it is the run itself (the
// run's own id stands in for it then).
const workedOn = (d) => (d.request_id && d.request_id !== d.run_id && d.request_id !== d.task_id ? d.request_id : null);

const STREAMED = { progress: "Progress", log: "Log", warning: "Warning", partial_result: "Partial result" };

function streamedStep(step, d) {
  const data = d.data || {};
  if (d.kind === "metrics") {
    step.title = `Turn ${d.turn} metrics`;
    step.kind = "minor";
    const tokens = data.prompt_tokens !== undefined ? `${data.prompt_tokens} in · ${data.completion_tokens} out` : null;
    const latency = typeof data.provider_latency_s === "number" ? `${data.provider_latency_s.toFixed(2)} s` : null;
    step.lines = [["Tokens", tokens], ["Provider latency", latency], ["Tool calls", data.tool_calls],
      ["Working on request", workedOn(d)], ["Reported", tokens === null ? d.message : null]];
    return;
  }
  step.title = `${STREAMED[d.kind] ?? d.kind}: ${clip(d.message)}`;
  step.kind = d.kind === "warning" ? "bad" : d.kind === "partial_result" ? "" : "minor";
  step.lines = [["Turn", d.turn], ["Message", d.message], ["Working on request", workedOn(d)],
    ["Data", Object.keys(data).length ? JSON.stringify(data) : null], ["Agent", d.agent_id],
    ["Truncated", d.truncated ? "yes" : null]];
}

// "agent:reviewer-2" -> "agent reviewer-2", "run:run-1" -> "run run-1"; anything else as the model wrote it.
function address(to) {
  const match = /^(agent|run):(.+)$/.exec(String(to ?? ""));
  return match ? `${match[1]} ${match[2]}` : String(to ?? "");
}

// Channels tried and failed ([{channel, error}]), one per line part: "telegram: Forbidden … · web: …".
function attempts(list) {
  return (list || []).map((a) => `${a.channel}: ${clip(a.error, 120)}`).join(" · ");
}

// A one-line preview of a free text (messages are up to 4096 characters; the details hold all of it).
function clip(text, max = 80) {
  const value = String(text ?? "").replace(/\s+/g, " ").trim();
  return value.length > max ? `${value.slice(0, max - 1)}…` : value;
}

function stepNode(step, openIds) {
  const li = h("li", { class: step.kind ? `k-${step.kind}` : "", dataset: { type: step.event?.type ?? step.type ?? "wait" } });
  li.append(h("span", { class: "step-title" }, step.title));
  const time = step.event?.time ?? step.time;
  if (time) li.append(h("span", { class: "step-time" }, when(time)));
  const lines = step.lines.filter(([, v]) => v !== null && v !== undefined && v !== "");
  if (lines.length) li.append(facts(lines));
  if (step.event) {
    const details = h("details", { open: openIds.has(step.event.id) },
      h("summary", {}, "Event details"),
      h("pre", {}, JSON.stringify(step.event, null, 2)));
    details.addEventListener("toggle", () => {
      if (details.open) openIds.add(step.event.id);
      else openIds.delete(step.event.id);
    });
    li.append(details);
  }
  return li;
}

// A finished run's totals (GET /runs/{id}'s usage, from its terminal event): "3 turns · 475 tokens (420 in, 55 out) ·
// 2 tool calls"; null while the run is live or when its terminal event carried none (an older executor's)
function usageLine(usage) {
  if (!usage) return null;
  const n = (count, one) => `${count.toLocaleString("en")} ${one}${count === 1 ? "" : "s"}`;
  const parts = [n(usage.turns, "turn"),
    `${n(usage.total_tokens, "token")} (${usage.prompt_tokens.toLocaleString("en")} in, ` +
    `${usage.completion_tokens.toLocaleString("en")} out)`, n(usage.tool_calls, "tool call")];
  if (usage.samplings) parts.push(n(usage.samplings, "sampling"));
  return h("span", { id: "run-usage" }, parts.join(" · "));
}

function runView(signal, runId) {
  const header = h("div", { class: "card", id: "run-header" }, "Loading…");
  const list = h("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  // this run's reruns (GET /runs?rerun_of=), newest first; hidden while it has none
  const reruns = h("section", { id: "run-reruns", hidden: true, "aria-labelledby": "run-reruns-title" },
    h("h2", { id: "run-reruns-title" }, "Reruns"), h("ul", { class: "reruns" }));
  show(h("h1", {}, "Run ", h("code", {}, runId)), header, reruns, h("h2", {}, "Timeline"), list);
  async function loadReruns() {
    const data = await api(`/runs?${new URLSearchParams({ rerun_of: runId, limit: "100" })}`, { signal });
    reruns.querySelector("ul").replaceChildren(...data.runs.map((r) => h("li", { dataset: { runId: r.run_id } },
      h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}` }, r.run_id), " ", stateBadge(r.state),
      h("span", { class: "muted" }, ` ${when(r.created_at)}${r.rerun_requested_by ? ` · asked by ${r.rerun_requested_by}` : ""}`))));
    reruns.hidden = !data.runs.length;
  }
  const openIds = new Set();
  let run = null;
  let events = [];
  const seen = new Set();

  // "6 Dec 2026, 18:02:11 (waiting 14 min)": the duration counts up with the page's ticker (data-since)
  const since = (iso) => {
    const at = iso ? Date.parse(iso) : NaN;
    if (Number.isNaN(at)) return when(iso);
    return h("span", {}, when(iso), " (waiting ",
      h("span", { id: "run-waited", dataset: { since: iso } }, duration((Date.now() - at) / 1000)), ")");
  };
  function renderHeader() {
    const card = run.agent_card || {};
    const pairs = [["State", stateBadge(run.state)], ["Title", run.title && uncut(run.title)], ["Agent", run.agent],
      // RUN-1: which prompt (its digest) and sandbox the run was started with (its run.started's agent card)
      ["Prompt", promptDigest(card.system_prompt_sha256, "run-prompt")],
      ["Sandbox", card.sandbox ? h("span", { id: "run-sandbox" }, sandboxSummary(card.sandbox)) : null],
      ["Trigger", run.trigger_id
        ? h("a", { href: `#/triggers/${encodeURIComponent(run.trigger_id)}`, id: "run-trigger" }, run.trigger_id) : null],
      ["Created", when(run.created_at)], ["Finished", run.finished_at && when(run.finished_at)],
      ["Usage", usageLine(run.usage)],
      // a cancelled run's "error" is why it was cancelled (and who asked): not an error
      ["Result", run.result], [run.state === "cancelled" ? "Cancelled" : "Error", run.error],
      ["Rerun of", run.rerun_of ? h("a", { href: `#/runs/${encodeURIComponent(run.rerun_of)}`, id: "run-rerun-of" },
        run.rerun_of) : null],
      ["Rerun asked by", run.rerun_requested_by]];
    if (run.waiting && (run.waiting.requests || []).length > 1) {
      // HUM-7: several questions at once -- each with whom, where and what became of it
      pairs.push(["Waiting for", h("ul", { id: "run-questions", class: "questions" },
        ...run.waiting.requests.map((q) => h("li", { dataset: { requestId: q.request_id } },
          `${person(q.recipient)} (${q.channel ?? "not notified yet"}): ${q.question} — ${questionStatus(q)}`)))],
        ["Since", since(run.waiting.since)]);
    } else if (run.waiting) {
      pairs.push(["Waiting for", person(run.waiting.recipient)],
        ["Channel", run.state === "waiting_for_human" ? run.waiting.channel ?? "not notified yet" : run.waiting.channel],
        ["Question", run.waiting.question], ["Since", since(run.waiting.since)]);
    }
    const nodes = [facts(pairs)];
    if (run.projected === false) {
      nodes.push(h("p", { class: "muted", id: "run-unprojected" },
        "Known from its events only: no run event (run requested, created, started …) has been journaled for " +
        "this id yet. The timeline shows what is known."));
    } else if (mayOperate() && !TERMINAL.has(run.state)) nodes.push(cancelForm(run.run_id, signal, () => reload()));
    header.replaceChildren(...nodes);
  }
  function renderTimeline() {
    list.replaceChildren(...timeline(events, run).map((s) => stepNode(s, openIds)));
  }
  async function reload() {
    run = await api(`/runs/${encodeURIComponent(runId)}`, { signal });
    renderHeader();
    renderTimeline();
    await loadReruns();
  }
  const refreshRun = debounce(() => reload().catch(failed), 200);

  (async () => {
    const [r, trajectory] = await Promise.all([
      api(`/runs/${encodeURIComponent(runId)}`, { signal }),
      api(`/runs/${encodeURIComponent(runId)}/events`, { signal }),
    ]);
    run = r;
    events = trajectory.events;
    for (const e of events) seen.add(e.id);
    renderHeader();
    renderTimeline();
    loadReruns().catch(failed);
    // the tail's cursor is the commit order (commit_seq), not the stream order the trajectory is sorted by
    const after = events.reduce((last, e) => Math.max(last, e.commit_seq), 0);
    tail({ run_id: runId, after }, (event) => {
      if (seen.has(event.id)) return;
      seen.add(event.id);
      events.push(event);
      events.sort((a, b) => a.stream_seq - b.stream_seq);
      renderTimeline();
      refreshRun();
    }, signal);
    // the "Waiting N min" step counts up while the page is open
    const waits = () => run?.state === "waiting_for_human" || run?.state === "waiting_for_agent";
    const ticker = setInterval(() => waits() && renderTimeline(), WAIT_TICK_MS);
    signal.addEventListener("abort", () => clearInterval(ticker));
    tickWaits(header, signal); // and the header's "(waiting 14 min)"
  })().catch((error) => {
    if (error?.name === "AbortError") return;
    if (error instanceof ApiError && error.status === 404) { // no such run: say so where "Loading…" was
      header.replaceChildren(
        h("p", { id: "run-missing" }, "The journal has no run with this id."),
        h("p", {}, h("a", { href: `#/runs?q=${encodeURIComponent(runId)}` }, "Search the runs for this id"),
          " · ", h("a", { href: "#/runs" }, "All runs")),
      );
      list.previousElementSibling.remove(); // the "Timeline" heading, over nothing
      list.remove();
      return;
    }
    header.replaceChildren(h("p", { id: "run-missing" }, "This run could not be loaded (see the message above)."));
    if (error instanceof NoAnswer) viewFailed = true;
    failed(error);
  });
}

// An action's button while its call is under way: disabled, saying what is happening ("Cancelling…"), aria-busy;
// as it was once the call is over (answered, refused, or no answer within API_TIMEOUT_MS).
async function pending(button, text, fn) {
  const label = button.textContent;
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  button.textContent = text;
  try {
    return await fn();
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
    button.textContent = label;
  }
}

// A reason typed when the session had ended is kept in this tab (sessionStorage) until the form shows again.
const cancelDraftKey = (runId) => `temporality.console.cancel-reason:${runId}`;

function cancelForm(runId, signal, done) {
  const reason = h("input", { name: "reason", required: true, maxlength: 500, placeholder: "Why stop this run?" });
  const draft = sessionStorage.getItem(cancelDraftKey(runId));
  if (draft !== null) {
    reason.value = draft;
    sessionStorage.removeItem(cancelDraftKey(runId));
  }
  const button = h("button", { class: "danger", type: "submit", id: "cancel-run" }, "Cancel run");
  const form = h("form", { class: "cancel-form", "aria-label": "Cancel the run" },
    h("label", {}, "Reason", reason), button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (button.disabled) return;
    try {
      const answer = await pending(button, "Cancelling…", () => api(`/runs/${encodeURIComponent(runId)}/cancel`, {
        method: "POST",
        body: { reason: reason.value.trim() },
        signal,
      }));
      message(`Cancel requested by ${answer.requested_by}; the run stops when the executor acts on it.`, "info");
      done();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401 && reason.value.trim()) {
        sessionStorage.setItem(cancelDraftKey(runId), reason.value);
      }
      failed(error);
    }
  });
  return form;
}

// ------------------------------------------------------------------ audit trail (operators)
// GET /audit: who did what, when -- trigger and directory changes, cancellations, reruns, refusals -- newest first,
// with the filters the API offers (kind, type, actor, since, until) and older pages. Every entry's details (the
// event's data, credential-like values redacted by the journal) one click (or Enter) away. Live: the page tails
// the audited events (/events/stream?audited=true) and, when one arrives, reads the first page of /audit with the
// page's filters again, putting the entries it did not show yet on top (marked new; a status line announces them).
// "Pause live updates" holds them back (counted) until resumed; the older pages loaded stay.
const AUDIT_KINDS = {
  trigger_change: "trigger changes",
  directory_change: "directory changes",
  cancellation: "cancellations",
  run_rerun: "reruns",
  permission_refusal: "refused human requests",
  access_refusal: "refused API access and sign-ins",
  bus_permission_refusal: "refused NATS permissions",
  agent_registration: "agent registrations",
  policy_change: "agent policy changes",
  agent_refusal: "refused agent messages",
  handoff: "hand-offs",
  dead_letter: "dead letters",
};

function auditView(signal, query) {
  if (!mayOperate()) {
    show(h("h1", {}, "Audit trail"), h("p", { class: "muted", id: "audit-role" }, "The audit trail needs the operator role."));
    return;
  }
  const params = new URLSearchParams(query);
  const field = (name, label, attrs = {}) => h("label", {}, label, h("input", { name, ...attrs,
    value: attrs.type === "datetime-local" ? localField(params.get(name)) : params.get(name) ?? "" }));
  const kind = h("select", { name: "kind" }, h("option", { value: "" }, "any"),
    Object.entries(AUDIT_KINDS).map(([value, label]) => h("option", { value, selected: params.get("kind") === value }, label)));
  const form = h("form", { class: "filters", id: "audit-filters" },
    h("label", {}, "Kind", kind),
    field("actor", "Who", { title: "A token's name, user:<id>, address:<client>, file:<path> …", spellcheck: "false" }),
    field("type", "Event type", { title: "e.g. api.access_refused", spellcheck: "false" }),
    field("since", "Since", { type: "datetime-local" }),
    field("until", "Before", { type: "datetime-local" }),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value) next.set(key, zoned(key, value.trim()));
    const hash = `#/audit${next.size ? `?${next}` : ""}`;
    if (location.hash === hash) go(hash);
    else location.hash = hash;
  });
  const body = h("tbody");
  const more = h("button", { type: "button", hidden: true }, "Older entries");
  const table = h("table", { id: "audit", class: "audit" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "When"), h("th", { scope: "col" }, "Kind"),
      h("th", { scope: "col" }, "Who"), h("th", { scope: "col" }, "What"))),
    body);
  const status = h("span", { id: "audit-live-status", role: "status", "aria-live": "polite" });
  const pause = h("button", { type: "button", id: "audit-pause", "aria-pressed": "false",
    "aria-describedby": "audit-live-status" }, "Pause live updates");
  const liveBar = h("div", { class: "live-bar", id: "audit-live" },
    h("span", { class: "live-dot", "aria-hidden": "true" }), status, pause);
  show(h("h1", {}, "Audit trail"), form, liveBar, table, more);

  const load = pagedList({
    path: "/audit", filters: ["kind", "actor", "type"], params, signal, body, more, key: (entry) => entry.id,
    items: (data) => data.entries, row: auditRow, columns: 4, empty: "Nothing in the audit trail matches.",
  });
  let paused = false;
  let held = 0; // audited events that arrived while paused
  let reading = null; // the read under way; one more after it when something arrived meanwhile
  let again = false;
  const idle = () => "Live: new entries matching the filters appear at the top.";
  status.textContent = idle();
  async function readNewer() {
    if (reading) {
      again = true;
      return;
    }
    reading = (async () => {
      do {
        again = false;
        const fresh = await load.newer();
        if (fresh.length) status.textContent = `${fresh.length} new ${fresh.length === 1 ? "entry" : "entries"} at the top.`;
      } while (again && !signal.aborted);
    })();
    try {
      await reading;
    } catch (error) {
      failed(error);
    } finally {
      reading = null;
    }
  }
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume live updates" : "Pause live updates";
    liveBar.dataset.paused = String(paused);
    if (paused) status.textContent = "Paused: new entries are held back.";
    else {
      status.textContent = idle();
      held = 0;
      readNewer(); // what arrived while paused, and anything a reconnect meanwhile did not count
    }
  });
  const arrived = () => {
    if (!paused) return readNewer();
    held += 1;
    status.textContent = `Paused: ${held} new audited ${held === 1 ? "event" : "events"} held back.`;
  };
  // (re)opened: what was audited between the first read and the tail's start (or while it was away) is read now
  tail({ audited: "true" }, arrived, signal, () => (paused ? null : readNewer()));
}

function auditRow(entry) {
  const what = h("td", { class: "audit-what" }, h("div", {}, entry.summary),
    h("details", {}, h("summary", {}, `Details (${entry.type})`), h("pre", {}, JSON.stringify(entry.details, null, 2))));
  if (entry.kind === "run_rerun" && entry.target) {
    what.prepend(h("div", { class: "muted" }, "rerun of ",
      h("a", { href: `#/runs/${encodeURIComponent(entry.target)}` }, entry.target)));
  }
  if (entry.run_id) what.prepend(h("div", {}, h("a", { href: `#/runs/${encodeURIComponent(entry.run_id)}` }, entry.run_id)));
  return h("tr", { dataset: { id: entry.id, kind: entry.kind } },
    h("td", { class: "nowrap" }, when(entry.time)),
    h("td", {}, AUDIT_KINDS[entry.kind] ?? entry.kind.replaceAll("_", " ")),
    h("td", { class: "audit-who" }, entry.actor ?? "—"),
    what);
}

// ------------------------------------------------------------------ waiting runs (UI-1)
function questionStatus(q) {
  if (q.status === "answered") return `answered by ${responderOf(q.responder, q.responder_display_name)}`;
  return q.status === "expired" ? "expired" : "waiting";
}

/** One line per question of the wait (a run may wait on several at once, HUM-7). */
function perQuestion(w, cell) {
  const questions = w.requests || [];
  if (questions.length < 2) return null;
  return questions.map((q) => h("div", { class: "question-line" }, cell(q)));
}

// "Waiting 14 min" since an instant, in a cell that tickWaits() keeps counting up (data-since).
function waitedCell(since) {
  const at = since ? Date.parse(since) : NaN;
  if (Number.isNaN(at)) return h("td", { class: "num" }, "—");
  return h("td", { class: "num waited", dataset: { since } }, duration((Date.now() - at) / 1000));
}

const WAIT_TICK_MS = 30_000;

// Every WAIT_TICK_MS while ``signal`` is live, the waited durations under ``root`` are computed again (only those
// cells: nothing is fetched, nothing else re-rendered).
function tickWaits(root, signal) {
  const timer = setInterval(() => {
    for (const cell of root.querySelectorAll("[data-since]")) {
      const text = duration((Date.now() - Date.parse(cell.dataset.since)) / 1000);
      if (cell.textContent !== text) cell.textContent = text;
    }
  }, WAIT_TICK_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}

function waitingView(signal) {
  const body = h("tbody", {}, loadingRow(7));
  show(
    h("h1", {}, "Waiting for a human or an agent"),
    h("table", { id: "waiting" },
      h("thead", {}, h("tr", {}, h("th", {}, "Run"), h("th", {}, "Whom"), h("th", {}, "Channel"),
        h("th", {}, "Question"), h("th", {}, "Since"), h("th", { class: "num" }, "Waiting"), h("th", {}, "Status"))),
      body),
  );
  async function load() {
    const data = await api("/runs/waiting", { signal });
    body.replaceChildren(...data.runs.map((run) => {
      const w = run.waiting || {};
      const channel = run.state === "waiting_for_agent" ? "agent (ask_agent)" : w.channel ?? "not notified yet";
      return h("tr", { dataset: { runId: run.run_id } },
        h("td", { class: "wide" }, h("a", { href: `#/runs/${encodeURIComponent(run.run_id)}` }, runTitle(run))),
        h("td", {}, ...(perQuestion(w, (q) => `${person(q.recipient)} (${questionStatus(q)})`) ?? [person(w.recipient)])),
        h("td", {}, ...(perQuestion(w, (q) => q.channel ?? "not notified yet") ?? [channel])),
        h("td", { class: "wide" }, ...(perQuestion(w, (q) => q.question) ?? [w.question ?? ""])),
        h("td", { class: "nowrap" }, when(w.since)),
        waitedCell(w.since),
        h("td", {}, stateBadge(run.state)));
    }));
    if (!data.runs.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "empty" }, "Nobody is being waited for.")));
  }
  load().catch((error) => {
    if (body.querySelector("tr.loading")) body.replaceChildren(notLoadedRow(7));
    failed(error);
  });
  tickWaits(body, signal); // the "Waiting" column counts up while the page is open, events or not
  const refresh = debounce(() => load().catch(failed), 1000);
  const moves = (type) => type.startsWith("human.") || type.startsWith("run.") || type.startsWith("agent.");
  tail({}, (e) => (moves(e.type) ? refresh() : null), signal, refresh);
}

// ------------------------------------------------------------------ triggers (UI-2)
// What moves the Triggers and Analytics pages: deliveries and trigger changes (trigger.*), runs (their states,
// last run, successful runs) and human requests and their outcomes.
const movesTriggers = (type) => type.startsWith("trigger.") || type.startsWith("run.") || type === "human.requested";
const movesAnalytics = (type) => type.startsWith("run.") || type.startsWith("human.");
// The deliveries the gateway answered 200 "ignored" (a ping, an event type the trigger does not list, a disabled
// trigger, its condition false): nothing failed, the trigger just does not take them. Journaled as trigger.rejected
// with one of these reasons (the journal's /triggers counts them apart: deliveries_ignored).
const IGNORED_REASONS = new Set(["unsupported_event", "disabled", "filtered"]);

function deliveryCounts(t) {
  const parts = [];
  if (t.deliveries_ignored) parts.push(`${t.deliveries_ignored} ignored`);
  if (t.deliveries_rejected) parts.push(`${t.deliveries_rejected} refused`);
  return parts.length ? h("div", { class: "muted" }, parts.join(" · ")) : null;
}

function triggersView(signal) {
  const body = h("tbody", {}, loadingRow(12));
  const definitions = definitionsSection(signal);
  show(
    h("h1", {}, "Triggers"),
    definitions,
    h("h2", {}, "What the journal saw"),
    h("p", { class: "muted" }, "What the journal saw of each trigger: its deliveries, runs and audit events."),
    h("table", { id: "triggers" },
      h("thead", {}, h("tr", {}, ...["Trigger", "Source", "Events seen", "Agent", "Enabled", "Last run"].map((t) => h("th", {}, t)),
        h("th", { class: "num" }, "Successful runs"), h("th", { class: "num" }, "Failed"),
        h("th", { class: "num" }, "Cancelled"), h("th", { class: "num", title: "every run of the trigger, those still going included" }, "All runs"),
        h("th", { class: "num" }, "Needed a human"),
        h("th", { class: "num", title: "accepted / received; ignored: the trigger does not take them (HTTP 200 ignored)" },
          "Deliveries"))),
      body),
  );
  async function load() {
    const data = await api("/triggers", { signal });
    body.replaceChildren(...data.triggers.map((t) => h("tr", { dataset: { triggerId: t.trigger_id } },
      h("td", {}, h("a", { href: `#/triggers/${encodeURIComponent(t.trigger_id)}` }, t.trigger_id)),
      h("td", { class: "ids" }, t.source ? idText(t.source) : "—"),
      h("td", { class: "ids" }, t.event_types.length ? idText(t.event_types.join(", ")) : "—"),
      h("td", {}, t.agent ?? "—"),
      h("td", {}, t.deleted ? "deleted" : t.enabled === null ? "unknown" : t.enabled ? "yes" : "no"),
      h("td", {}, t.last_run ? h("a", { href: `#/runs/${encodeURIComponent(t.last_run.run_id)}` }, when(t.last_run.created_at)) : "—",
        t.last_run ? h("div", {}, stateBadge(t.last_run.state)) : null),
      h("td", { class: "num runs-completed" }, t.runs_completed),
      h("td", { class: "num runs-failed" }, t.runs_failed ?? "—"),
      h("td", { class: "num runs-cancelled" }, t.runs_cancelled ?? "—"),
      h("td", { class: "num runs-total" }, t.runs_total ?? "—"),
      h("td", { class: "num needed-human" }, t.runs_needed_human),
      h("td", { class: "num deliveries" }, h("span", { class: "accepted-received" }, `${t.deliveries_accepted} / ${t.deliveries_received}`),
        deliveryCounts(t)))));
    if (!data.triggers.length) body.append(h("tr", {}, h("td", { colspan: 12, class: "empty" }, "No trigger has fired yet.")));
  }
  load().catch((error) => {
    if (body.querySelector("tr.loading")) body.replaceChildren(notLoadedRow(12));
    failed(error);
  });
  const refresh = debounce(() => load().catch(failed), 500);
  // the definitions (the gateway's) move with the trigger API's audit events; not while a delete is being confirmed
  const refreshDefinitions = debounce(() => {
    if (!definitions.querySelector(".confirm:not([hidden])")) definitions.reload?.();
  }, 500);
  tail({}, (e) => {
    if (movesTriggers(e.type)) refresh();
    if (TRIGGER_CHANGES.has(e.type)) refreshDefinitions();
  }, signal, refresh);
}

function deliveriesView(signal, triggerId) {
  const body = h("tbody");
  const more = h("button", { type: "button", id: "deliveries-older", hidden: true }, "Older deliveries");
  show(
    h("h1", {}, "Deliveries of ", h("code", {}, triggerId)),
    h("table", { id: "deliveries" },
      h("thead", {}, h("tr", {}, ...["Delivery", "Event", "Outcome", "Reason", "Run", "Time"].map((t) => h("th", {}, t)))),
      body),
    more,
  );
  // the journal's deliveries, 50 at a time ("Older deliveries"); a change re-reads the rows loaded
  const load = pagedList({
    path: `/triggers/${encodeURIComponent(triggerId)}/deliveries`, signal, body, more, columns: 6,
    empty: "No deliveries.", items: (data) => data.deliveries,
    key: (d) => d.delivery_id, position: (d) => listPosition(d.time, d.delivery_id),
    row: (d) => h("tr", { dataset: { deliveryId: d.delivery_id, outcome: d.outcome } },
      h("td", { class: "ids" }, idText(d.delivery_id)), h("td", { class: "ids" }, d.event_type ? idText(d.event_type) : "—"),
      h("td", { class: "outcome" }, d.outcome),
      h("td", {}, reason("delivery", d.reason)),
      h("td", { class: "ids" }, d.run_id ? h("a", { href: `#/runs/${encodeURIComponent(d.run_id)}` }, idText(d.run_id)) : "—"),
      h("td", { class: "nowrap" }, when(d.time))),
  });
  const processing = processingSection(signal, triggerId);
  $("view").append(processing);
  const refresh = debounce(() => {
    load.refresh().catch(failed);
    processing.reload?.();
  }, 500);
  const ours = (e) => e.type.startsWith("trigger.") && e.data?.trigger_id === triggerId;
  tail({}, (e) => (ours(e) ? refresh() : null), signal, refresh);
}

// The gateway's processing state of a trigger's deliveries (through /gateway/), with Re-drive for a rejected
// or failed one whose event the gateway kept (operator; the gateway decides and says why not).
const REDRIVABLE = new Set(["rejected", "failed"]);

function processingSection(signal, triggerId) {
  const body = h("tbody");
  const more = h("button", { type: "button", id: "processing-older", hidden: true }, "Older deliveries (gateway)");
  const holder = h("div", {},
    h("table", { id: "processing" },
      h("thead", {}, h("tr", {}, ...["Delivery", "State", "Reason", "Run", "Received", ""].map((t) => h("th", {}, t)))),
      body),
    more);
  const base = `${GATEWAY}/${encodeURIComponent(triggerId)}/deliveries`;

  async function redrive(d, cell) {
    cell.replaceChildren("Re-driving…");
    try {
      const answer = await api(`${base}/${encodeURIComponent(d.delivery_id)}/redrive`, { method: "POST", signal });
      message(`Delivery ${d.delivery_id} re-driven as ${answer.delivery_id}: ${answer.status}` +
        `${answer.run_id ? ` (run ${answer.run_id})` : ""}.`, "info");
      await reread();
    } catch (error) {
      cell.replaceChildren();
      if (error instanceof ApiError && error.status === 409) {
        message(`Not re-driven: ${error.message} (409 ${error.code}).`);
        await reread();
      } else failed(error);
    }
  }

  // An accepted delivery runs again only as a new run, numbered: the same number sent twice (a double click)
  // is the same run; the next one is 1 + the highest rerun of it listed here.
  async function rerun(d, n, cell) {
    if (!window.confirm(`Run delivery ${d.delivery_id} again as a new run (rerun ${n}) with the trigger as it is now?`)) return;
    cell.replaceChildren("Starting…");
    try {
      const answer = await api(`${base}/${encodeURIComponent(d.delivery_id)}/redrive`,
        { method: "POST", body: { rerun: n }, signal });
      message(`Delivery ${d.delivery_id} rerun ${n} as ${answer.delivery_id}: ${answer.status}` +
        `${answer.run_id ? ` (run ${answer.run_id})` : ""}.`, "info");
      await reread();
    } catch (error) {
      cell.replaceChildren();
      if (error instanceof ApiError && error.status === 409) {
        message(`Not rerun: ${error.message} (409 ${error.code}).`);
        await reread();
      } else failed(error);
    }
  }

  const reruns = new Map(); // delivery id -> its highest rerun loaded (reruns are newer: on the same page or above)
  const row = (d) => {
    const actions = h("div", { class: "actions-box" });
    if (mayOperate() && REDRIVABLE.has(d.state) && d.has_event !== false) {
      actions.append(h("button", { type: "button", onclick: () => redrive(d, actions) }, "Re-drive"));
    } else if (mayOperate() && d.state === "accepted" && d.has_event !== false) {
      const n = (reruns.get(d.delivery_id) ?? 0) + 1;
      actions.append(h("button", { type: "button", title: "Start a new run from this delivery's event",
        onclick: () => rerun(d, n, actions) }, "Rerun"));
    }
    // the gateway's "rejected" for a delivery it answered 200 ignored reads "ignored" (data-state stays the gateway's)
    const ignored = d.state === "rejected" && IGNORED_REASONS.has(d.reason);
    return h("tr", { dataset: { deliveryId: d.delivery_id, state: d.state, shown: ignored ? "ignored" : d.state } },
      h("td", { class: "ids" }, idText(d.delivery_id), d.redrive_of
        ? h("div", { class: "muted" }, d.rerun ? `rerun ${d.rerun} of ${d.redrive_of}` : `re-drive of ${d.redrive_of}`)
        : null),
      h("td", { class: "state-cell", title: ignored ? "the gateway's state: rejected (answered 200 ignored)" : null },
        ignored ? "ignored" : d.state),
      h("td", { class: "wide" }, reason("delivery", d.reason), d.reason && d.detail ? ": " : null, d.detail ?? null),
      h("td", { class: "ids" }, d.run_id ? h("a", { href: `#/runs/${encodeURIComponent(d.run_id)}` }, idText(d.run_id)) : "—"),
      h("td", { class: "nowrap" }, when(d.received_at)),
      h("td", { class: "actions" }, actions));
  };
  let gone = false; // the gateway holds no such trigger: not asked again
  const onError = (error) => {
    if (error instanceof ApiError && error.status === 404) {
      gone = true;
      holder.replaceChildren(h("p", { class: "muted" }, `The trigger-gateway holds no trigger ${triggerId} (${error.code}).`));
    } else gatewayFailed(error, holder);
  };
  let load = null; // the gateway's pages (its next_cursor), 50 at a time ("Older deliveries (gateway)")
  const reread = () => (gone || !load ? Promise.resolve() : load.refresh().catch(onError));
  const section = h("section", { id: "processing-section" },
    h("h2", {}, "Processing state (trigger-gateway)"), holder);
  load = pagedList({
    path: base, signal, body, more, columns: 6, empty: "No deliveries recorded.", items: (data) => data.deliveries,
    cursorParam: "cursor", nextCursor: (data) => data.next_cursor, maxLimit: 100, onError,
    onLoaded: () => sectionProblem(holder, null),
    key: (d) => d.delivery_id, position: (d) => listPosition(d.received_at, d.delivery_id),
    prepare: (all) => {
      reruns.clear();
      for (const d of all) {
        if (d.rerun && d.redrive_of) reruns.set(d.redrive_of, Math.max(reruns.get(d.redrive_of) ?? 0, d.rerun));
      }
    },
    row,
  });
  section.reload = () => reread();
  return section;
}

// ------------------------------------------------------------------ trigger definitions and the wizard (UI-2)
// Through the journal's /gateway/ proxy to the trigger-gateway's admin API (docs/console.md): the gateway
// checks the token (viewer reads and previews, operator enables/disables, admin creates, replaces, deletes).
const GATEWAY = "/gateway/triggers";
// Every auth type the form offers ("none" first). The adapters -- which systems send webhooks, the auth types each
// accepts besides "none" (the first one preselected when the adapter is typed or picked while the auth type is still
// the form's own "none", never once the person picked one, nor when editing: "none" is accepted for every adapter,
// but unauthenticated, with a warning) and the event types each knows -- are the gateway's own: GET /gateway/adapters
// (its adapter registry), read when the wizard opens.
const AUTH_TYPES = ["none", "basic", "bearer", "github", "gitlab", "header", "hmac_sha256", "standard_webhooks",
  "mindmap"];
// The ``*_env`` field that names each auth type's secret (literal secrets are never written here): mindmap's
// signing secret is secret_env and its per-trigger token token_env (both; the gateway's auth model).
const SECRET_ENV = { basic: "password_env", bearer: "token_env" };
const secretEnvField = (type) => (type === "none" || !AUTH_TYPES.includes(type) ? null : SECRET_ENV[type] ?? "secret_env");
const tokenEnvField = (type) => (type === "mindmap" ? "token_env" : null);
// The auth fields the form edits for a type (the rest of a stored auth of the same type is kept as it is).
const authFormFields = (type) => [secretEnvField(type), tokenEnvField(type), type === "basic" ? "username" : null,
  ["header", "hmac_sha256"].includes(type) ? "header" : null].filter(Boolean);
// Patterns the gateway checks, in words (its 422 and the browser's own message would show the expression).
const PATTERN_WORDS = {
  id: "lowercase letters, digits and '-', starting with a letter or digit, up to 63 characters",
  env: "a variable name: letters, digits and '_', not starting with a digit",
  recipient: "user:<id> or group:<id>, each without spaces",
  agent: "an agent id: lowercase letters, digits, '-' and '_'",
  header: "a header name (letters, digits and '-')",
  input: "a field name: letters, digits and '_', not starting with a digit, up to 64 characters",
};
// Fields only one trigger type has: dropped when the wizard saves another type.
const TYPE_FIELDS = {
  webhook: ["adapter", "events", "auth"],
  schedule: ["cron", "timezone", "missed"],
  event: ["event_type", "filter", "allow_self"],
};
const etagOf = (revision) => `"${revision}"`;
const NO_AUTH_WARNING = "No authentication: anyone who can reach the trigger-gateway's /hooks/ address can start " +
  "runs of this trigger. Pick the auth type the source signs or authenticates its calls with.";
// human.on_timeout.action (docs/triggers.md): what a run does when nobody answered by the deadline.
const ON_TIMEOUT = { fail: "fail the run", default: "resume with a default option", cancel: "cancel the run" };
const MAX_CHAIN_S = 30 * 24 * 3600; // renotify.every_s and escalate.after_s at most (the protocol's bound)
// The wizard's six steps (UI-2), then a review with Save.
const WIZARD_STEPS = ["Where the event comes from", "Which event", "Which agent", "Which data", "Who may be asked",
  "When nobody answers"];
// The trigger admin API's audit events (journaled): the definitions list moves with them.
const TRIGGER_CHANGES = new Set(["trigger.created", "trigger.updated", "trigger.enabled", "trigger.disabled", "trigger.deleted"]);

function gatewayFailed(error, where) {
  if (error instanceof ApiError && error.code === "gateway_not_configured") {
    where.replaceChildren(h("p", { class: "muted", id: "gateway-off" },
      "Trigger definitions are not available here: the journal has no TEMPORALITY_JOURNAL_GATEWAY_URL."));
    return;
  }
  failed(error, where); // a gateway's 401 is said in the section (nobody is signed out)
}

// UI-2's "source" and "event" of a definition, as configured (the journal's table below shows what came).
function configuredSource(t) {
  if (t.type === "webhook") return t.adapter ?? "—";
  if (t.type === "schedule") return t.timezone ? `cron (${t.timezone})` : "cron";
  if (t.type === "event") return "the journal's events";
  return "—";
}

function configuredEvents(t) {
  if (t.type === "webhook") return t.events?.length ? t.events.join(", ") : "—";
  if (t.type === "schedule") return t.cron ?? "—";
  if (t.type === "event") return t.event_type === undefined ? "—" : [].concat(t.event_type).join(", ");
  return "—";
}

function definitionsSection(signal) {
  const body = h("tbody", {}, loadingRow(10));
  const section = h("section", { id: "definitions" });
  const toolbar = h("div", { class: "toolbar" },
    h("h2", {}, "Definitions"),
    mayAdmin() ? h("a", { class: "button primary", href: "#/wizard", id: "new-trigger" }, "New trigger") : null);
  const table = h("table", { id: "trigger-defs" },
    h("thead", {}, h("tr", {}, ...["Trigger", "Name", "Type", "Source", "Events", "Agent", "Enabled", "Revision", "Changed by", ""]
      .map((t) => h("th", {}, t)))),
    body);
  const holder = h("div", {}, table);
  section.append(toolbar, holder);

  async function load() {
    const data = await api(GATEWAY, { signal });
    sectionProblem(holder, null);
    body.replaceChildren(...data.triggers.map((item) => definitionRow(item, signal, load)));
    if (!data.triggers.length) body.append(h("tr", {}, h("td", { colspan: 10, class: "empty" }, "No triggers defined.")));
  }
  section.reload = () => load().catch((error) => {
    if (body.querySelector("tr.loading")) body.replaceChildren(notLoadedRow(10));
    gatewayFailed(error, holder);
  });
  section.reload();
  return section;
}

function definitionRow(item, signal, reload) {
  const t = item.trigger;
  const actions = h("div", { class: "actions-box" }); // a box in the cell: the cell stays a table cell
  const row = h("tr", { dataset: { triggerId: t.id } },
    h("td", {}, h("a", { href: `#/triggers/${encodeURIComponent(t.id)}` }, t.id)),
    h("td", {}, t.name ?? ""),
    h("td", {}, t.type ?? "?"),
    h("td", { class: "source" }, configuredSource(t)),
    h("td", { class: "events ids" }, idText(configuredEvents(t))),
    h("td", {}, t.agent ?? "—"),
    h("td", { class: "enabled" }, t.enabled === false ? "no" : "yes"),
    h("td", { class: "num" }, item.revision),
    h("td", { class: "anywhere" }, item.updated_by ?? "—", item.problem ? h("div", { class: "bad" }, item.problem) : null),
    h("td", { class: "actions" }, actions));
  const act = async (path, method, done, button, doing) => {
    try {
      await pending(button, doing, () =>
        api(`${GATEWAY}/${encodeURIComponent(t.id)}${path}`, { method, signal, ifMatch: etagOf(item.revision) }));
      message(done, "success");
      await reload();
    } catch (error) {
      if (error instanceof ApiError && error.status === 412) {
        message(`Someone else changed ${t.id} meanwhile (412): the list is reloaded, try again.`);
        reload().catch(failed);
      } else failed(error);
    }
  };
  if (mayAdmin()) actions.append(h("a", { class: "button", href: `#/wizard/${encodeURIComponent(t.id)}` }, "Edit"));
  if (mayOperate()) {
    const enabled = t.enabled !== false;
    const toggle = h("button", {
      type: "button",
      onclick: () => act(enabled ? "/disable" : "/enable", "POST", `${t.id} ${enabled ? "disabled" : "enabled"}.`,
        toggle, enabled ? "Disabling…" : "Enabling…"),
    }, enabled ? "Disable" : "Enable");
    actions.append(toggle);
  }
  if (mayAdmin()) {
    const confirmBox = h("span", { class: "confirm", hidden: true },
      `Delete ${t.id}? `,
      h("button", { type: "button", class: "danger", onclick: (event) => act("", "DELETE", `${t.id} deleted.`,
        event.currentTarget, "Deleting…") }, "Yes, delete"),
      h("button", { type: "button", onclick: () => { confirmBox.hidden = true; } }, "Keep"));
    actions.append(h("button", { type: "button", onclick: () => { confirmBox.hidden = false; } }, "Delete"), confirmBox);
  }
  return row;
}

// A gateway message naming a regular expression ("String should match pattern '^(user|group):\\S+$'"), in words:
// what the field takes. ``path`` is the field's (``human.allowed_recipients[0]``).
export function patternInWords(path, text) {
  const value = String(text ?? "");
  if (!/should match pattern/.test(value)) return value;
  const name = String(path ?? "");
  const words = /(^|\.)id$/.test(name) ? PATTERN_WORDS.id
    : /_env$/.test(name) ? PATTERN_WORDS.env
    : /allowed_recipients|escalate\.to/.test(name) ? PATTERN_WORDS.recipient
    : /^agent$/.test(name) ? PATTERN_WORDS.agent
    : /header$/.test(name) ? PATTERN_WORDS.header
    : /^input\./.test(name) ? PATTERN_WORDS.input
    : null;
  return words ? `must be ${words}` : "does not have the form this field takes";
}

// The same for a whole detail ("field: message; field: message", as the gateway joins them).
const detailInWords = (detail) => String(detail ?? "").split("; ")
  .map((part) => part.replace(/^([^:\s]+): (.*)$/, (all, path, text) => `${path}: ${patternInWords(path, text)}`))
  .join("; ");
const errorsInWords = (errors) => (errors ?? []).map((e) => ({ ...e, message: patternInWords(e.field, e.message) }));

// "a, b\nc" -> ["a", "b", "c"]
const listOf = (text) => text.split(/[\s,]+/).map((v) => v.trim()).filter(Boolean);

// "field = expression" lines -> {field: expression}; throws naming the bad line.
function pairsOf(text, what) {
  const out = {};
  for (const [i, raw] of text.split("\n").entries()) {
    const line = raw.trim();
    if (!line) continue;
    const eq = line.indexOf("=");
    if (eq <= 0) throw new Error(`${what}, line ${i + 1}: write name = value`);
    out[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return out;
}

// "Name: value" lines -> {Name: value}; throws naming the bad line.
function headersOf(text) {
  const out = {};
  for (const [i, raw] of text.split("\n").entries()) {
    const line = raw.trim();
    if (!line) continue;
    const colon = line.indexOf(":");
    if (colon <= 0) throw new Error(`Sample headers, line ${i + 1}: write Name: value`);
    out[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  }
  return out;
}

function wizardView(signal, triggerId) {
  const editing = triggerId !== null;
  const title = h("h1", {}, editing ? "Edit trigger " : "New trigger", editing ? h("code", {}, triggerId) : null);
  if (!mayAdmin()) {
    show(title, h("p", { class: "muted" }, signedInPerson()
      ? "Creating and changing triggers needs the admin role."
      : "Creating and changing triggers needs the admin role (an admin token)."));
    return;
  }
  const root = h("div", {}, editing ? "Loading…" : null);
  show(title, root);
  let base = {}; // what the gateway holds (editing): fields the form does not show are kept
  let etag = null;

  // A labelled control; its help text and the gateway's word on it (a 422 naming its field) describe it (not
  // part of its accessible name).
  const problems = new Map(); // control -> its error line
  const field = (label, control, help) => {
    control.id = `tw-${control.name}`;
    const note = help ? h("span", { class: "muted", id: `tw-${control.name}-help` }, help) : null;
    const error = h("p", { class: "field-error", id: `tw-${control.name}-error`, hidden: true });
    problems.set(control, error);
    control.setAttribute("aria-describedby", [note?.id, error.id].filter(Boolean).join(" "));
    return h("div", { class: "field" }, h("label", { for: control.id }, label), control, note, error);
  };
  const input = (name, attrs = {}) => h("input", { name, ...attrs });
  const area = (name, rows, attrs = {}) => h("textarea", { name, rows, ...attrs });
  const select = (name, options) => h("select", { name }, options.map((o) => h("option", { value: o }, o)));
  // "name = value" lines of a field; an error names that field (error.control)
  const pairsIn = (control, what) => {
    try {
      return pairsOf(control.value, what);
    } catch (error) {
      error.control = control;
      throw error;
    }
  };

  const f = {
    // the `-` escaped: browsers compile a pattern with the ``v`` flag, where a bare `-` at a class's end is invalid
    id: input("id", { required: true, pattern: "[a-z0-9][a-z0-9\\-]{0,62}", disabled: editing,
      dataset: { words: PATTERN_WORDS.id } }),
    name: input("name", { required: true, maxlength: 200 }),
    type: select("type", ["webhook", "schedule", "event"]),
    enabled: input("enabled", { type: "checkbox", checked: true }),
    agent: input("agent", { required: true }),
    adapter: input("adapter", { list: "adapters" }),
    events: input("events", { placeholder: "git.pullrequest.created, git.pullrequest.updated" }),
    authType: select("auth_type", AUTH_TYPES),
    username: input("username"),
    header: input("header", { placeholder: "X-Api-Key" }),
    secretEnv: input("secret_env", { placeholder: "HOOK_SECRET", pattern: "[A-Za-z_][A-Za-z0-9_]*",
      dataset: { words: PATTERN_WORDS.env } }),
    tokenEnv: input("token_env", { placeholder: "MINDMAP_TOKEN", pattern: "[A-Za-z_][A-Za-z0-9_]*",
      dataset: { words: PATTERN_WORDS.env } }),
    cron: input("cron", { placeholder: "0 3 * * *" }),
    timezone: input("timezone", { placeholder: "UTC" }),
    eventType: input("event_type", { placeholder: "run.failed" }),
    filter: area("filter", 2, { placeholder: "actor_id = reviewer" }),
    mapping: area("input", 4, { placeholder: "repository = payload.repository.name\nauthor = actor.display_name || actor.id" }),
    prompt: area("prompt", 3, { maxlength: 8000, placeholder: "Review PR ${pr} in ${repository}: check the API contract." }),
    when: input("when", { maxlength: 2000, placeholder: "payload.pull_request.draft == `false`" }),
    dedupe: input("dedupe", { type: "number", min: 1, max: 7, placeholder: "7" }),
    concurrencyKey: input("concurrency_key", { placeholder: "payload.repository.id" }),
    concurrencyMode: select("concurrency_mode", ["queue", "skip", "supersede"]),
    debounce: input("debounce", { type: "number", min: 1, max: 86400, placeholder: "none" }),
    maxQueued: input("max_queued", { type: "number", min: 1, max: 100, placeholder: "20" }),
    recipients: input("recipients", { placeholder: "user:alice, user:bob" }),
    timeout: input("timeout", { type: "number", min: 1, placeholder: "3600" }),
    maxTimeout: input("max_timeout", { type: "number", min: 1, placeholder: "604800" }),
    onTimeout: h("select", { name: "on_timeout_action" }, Object.entries(ON_TIMEOUT).map(([value, label]) =>
      h("option", { value }, label))),
    defaultOption: input("default_option", { maxlength: 64, placeholder: "approve" }),
    renotifyEvery: input("renotify_every", { type: "number", min: 1, max: MAX_CHAIN_S, placeholder: "none" }),
    renotifyMax: input("renotify_max", { type: "number", min: 1, max: 20, placeholder: "none" }),
    escalateTo: input("escalate_to", { placeholder: "group:leads" }),
    escalateAfter: input("escalate_after", { type: "number", min: 1, max: MAX_CHAIN_S, placeholder: "none" }),
    sample: area("sample", 6, { placeholder: '{"type": "order.created", "id": "ord-1", "data": {"order_id": 42}}' }),
    headers: area("headers", 2, { placeholder: "X-GitHub-Event: pull_request\nX-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958" }),
  };
  // the auth type's own fields: shown only for the types that read them (showAuth)
  const usernameField = field("User name", f.username, "basic: the user name the sender gives");
  const headerField = field("Header", f.header, "the header carrying the secret or the signature");
  const secretEnvField_ = field("Secret environment variable", f.secretEnv,
    "the name of the gateway's variable holding the secret (*_env); never the secret itself");
  const tokenEnvField_ = field("Token environment variable", f.tokenEnv,
    "mindmap: the name of the gateway's variable holding this trigger's X-Mindmap-Token (token_env); the secret " +
    "above signs the body");
  // auth "none": whoever reaches the gateway's /hooks/<id> starts runs -- said beside the field and on the review
  const noAuthWarning = h("p", { class: "warning", id: "auth-none-warning", role: "note" }, NO_AUTH_WARNING);
  const showAuth = () => {
    const type = f.authType.value;
    noAuthWarning.hidden = type !== "none";
    usernameField.hidden = type !== "basic";
    headerField.hidden = !["header", "hmac_sha256"].includes(type);
    secretEnvField_.hidden = secretEnvField(type) === null;
    tokenEnvField_.hidden = tokenEnvField(type) === null;
  };
  f.authType.addEventListener("change", showAuth);
  let authPicked = editing;  // the stored auth, or the person's own pick, is never replaced
  f.authType.addEventListener("change", () => { authPicked = true; });
  // the gateway's adapters by name (GET /gateway/adapters), once read; until then (or when the gateway cannot say)
  // the adapter is typed freely and nothing is preselected
  let adapters = {};
  const adapterOptions = h("datalist", { id: "adapters" });
  const knownEvents = h("p", { class: "muted", id: "tw-events-known", hidden: true });
  const showKnownEvents = () => {
    const adapter = adapters[f.adapter.value.trim()];
    const known = adapter?.event_types;
    knownEvents.hidden = !adapter;
    knownEvents.textContent = !adapter ? ""
      : known ? `${adapter.name} sends: ${known.join(", ")}` : `${adapter.name}: any type the sender names`;
  };
  const preselectAuth = () => {
    showKnownEvents();
    const accepted = adapters[f.adapter.value.trim()]?.auth_types;
    if (authPicked || !accepted?.length || accepted.includes(f.authType.value)) return;
    f.authType.value = accepted[0];
    showAuth();
  };
  f.adapter.addEventListener("change", preselectAuth);
  f.adapter.addEventListener("input", preselectAuth);
  api("/gateway/adapters", { signal }).then((data) => {
    adapters = Object.fromEntries(data.adapters.map((a) => [a.name, a]));
    adapterOptions.replaceChildren(...data.adapters.map((a) => h("option", { value: a.name, label: a.description })));
    preselectAuth();  // what was typed before the answer came
  }).catch((error) => {
    if (error?.name !== "AbortError") adapterOptions.dataset.unavailable = "true";
  });
  const typeNote = (type, text) => h("p", { class: "muted type-note", dataset: { forType: type } }, text);
  // the type-specific parts: shown only for their type (.showParts)
  const webhookSource = h("div", { class: "part", dataset: { forType: "webhook" }, id: "part-webhook" },
    field("Adapter", f.adapter, "which system sends it: azure_devops.pull_request, github, gitlab, generic, …"),
    adapterOptions,
    field("Auth type", f.authType, "how the gateway checks the sender"),
    noAuthWarning, usernameField, headerField, secretEnvField_, tokenEnvField_);
  f.authType.setAttribute("aria-describedby", `${f.authType.getAttribute("aria-describedby")} ${noAuthWarning.id}`);
  const webhookEvents = h("div", { class: "part", dataset: { forType: "webhook" } },
    field("Event types", f.events, "comma-separated, as the source names them"), knownEvents);
  const scheduleWhen = h("div", { class: "part", dataset: { forType: "schedule" }, id: "part-schedule" },
    field("Cron", f.cron, "minute hour day month weekday"), field("Time zone", f.timezone, "IANA, e.g. Europe/Berlin"));
  const eventWhich = h("div", { class: "part", dataset: { forType: "event" }, id: "part-event" },
    field("Event type", f.eventType, "one or more system event types, comma-separated"),
    field("Filter", f.filter, "name = value lines: actor_id, actor_type, project, data.<field>"));
  const defaultOptionField = field("Default option", f.defaultOption,
    "the option id the run resumes with, as the agent's question offers it");
  const showDefault = () => { defaultOptionField.hidden = f.onTimeout.value !== "default"; };
  f.onTimeout.addEventListener("change", showDefault);

  const previewOut = h("div", { id: "preview", "aria-live": "polite" });
  const previewButton = h("button", { type: "button", id: "preview-button" }, "Preview");

  // The six steps (UI-2), then the review. Each step is a fieldset whose legend is its heading.
  const panels = WIZARD_STEPS.map((title, i) => {
    const heading = h("h2", { tabindex: -1, id: `wizard-step-${i + 1}-title` }, `Step ${i + 1} of 6: ${title}`);
    return h("fieldset", { class: "wizard-step", id: `wizard-step-${i + 1}`, hidden: true,
      dataset: { step: i + 1 } }, h("legend", {}, heading));
  });
  panels[0].append(
    field("Id", f.id, PATTERN_WORDS.id), field("Name", f.name), field("Type", f.type,
      "webhook: a system calls the gateway; schedule: a clock; event: an event of Temporality itself"),
    h("label", { class: "inline" }, f.enabled, "Enabled"),
    webhookSource,
    typeNote("schedule", "A schedule comes from the gateway's own clock: when it fires is the next step."),
    typeNote("event", "An event trigger listens to Temporality's own events on the bus: which ones is the next step."));
  panels[1].append(webhookEvents, scheduleWhen, eventWhich,
    field("Condition (when)", f.when,
      "JMESPath over the event; a delivery for which it is not true starts no run (filtered); empty: every one"),
    field("Remember event ids (days)", f.dedupe, "a source event id delivered again within this is a duplicate; empty: 7"));
  panels[2].append(
    field("Agent", f.agent, "an agent id of the agent cards"),
    h("fieldset", { id: "part-flow" }, h("legend", {}, "Runs at the same time"),
      field("Concurrency key", f.concurrencyKey,
        "JMESPath over the event: at most one active run per value; empty: no flow control"),
      field("When a run of the key is active", f.concurrencyMode,
        "queue: start after it; skip: refuse the new event; supersede: cancel the older run"),
      field("Debounce (s)", f.debounce, "start only once no new event of the key came for this long (the latest wins)"),
      field("Queue at most", f.maxQueued, "queue: events waiting per key (default 20)")));
  panels[3].append(
    field("Input mapping", f.mapping, "field = JMESPath over the normalized event, one per line; empty: the payload"),
    field("Prompt (first message)", f.prompt,
      "the task the run starts with, in input.prompt; ${field} takes a field of the input mapping; empty: none"),
    h("fieldset", { id: "part-preview" }, h("legend", {}, "Preview on a sample"),
      typeNote("schedule", "A schedule has no delivery to preview."),
      field("Sample payload (JSON)", f.sample,
        "a delivery's body (webhook) or a CloudEvent (event); Next previews it too; nothing is started"),
      field("Sample headers", f.headers, "Name: value lines, as the source sends them (e.g. GitHub's X-GitHub-Event " +
        "and X-GitHub-Delivery)"),
      previewButton, previewOut));
  panels[4].append(
    field("Allowed recipients", f.recipients, "user:<id> or group:<id>, comma-separated; the agent may ask no one else"),
    field("Default timeout (s)", f.timeout, "how long a question waits for an answer; empty: 3600"),
    field("Maximum timeout (s)", f.maxTimeout,
      "the longest an agent may let a question wait (a longer one is cut to this); empty: 604800 (7 days)"));
  panels[5].append(
    field("At the deadline", f.onTimeout, "what the run does when nobody answered in time"),
    defaultOptionField,
    field("Remind every (s)", f.renotifyEvery, "ask the same people again this often before the deadline; empty: never"),
    field("Reminders at most", f.renotifyMax, "1 to 20, with Remind every"),
    field("Escalate to", f.escalateTo, "user:<id> or group:<id>, asked as well; empty: nobody"),
    field("Escalate after (s)", f.escalateAfter, "seconds after the question (after the reminders, if any)"));
  const reviewTitle = h("h2", { tabindex: -1, id: "wizard-review-title" }, "Review and save");
  const reviewBody = h("div", { id: "wizard-summary" });
  const reviewPanel = h("section", { class: "wizard-step", id: "wizard-review", hidden: true,
    "aria-labelledby": reviewTitle.id }, reviewTitle, reviewBody);
  const REVIEW = WIZARD_STEPS.length;
  const showParts = () => {
    for (const node of [...panels, reviewPanel].flatMap((p) => [...p.querySelectorAll("[data-for-type]")])) {
      node.hidden = node.dataset.forType !== f.type.value;
    }
    previewButton.disabled = f.type.value === "schedule";
  };
  f.type.addEventListener("change", showParts);

  const stepButtons = [...WIZARD_STEPS, "Review"].map((title, i) => h("button", {
    type: "button", class: "step", dataset: { step: i + 1 },
    onclick: () => jump(i),
  }, i < REVIEW ? h("span", { class: "step-number" }, `${i + 1}`) : null, title));
  const indicator = h("nav", { class: "steps", "aria-label": "Wizard steps" },
    h("ol", {}, stepButtons.map((b) => h("li", {}, b))));
  const backButton = h("button", { type: "button", id: "wizard-back" }, "Back");
  const nextButton = h("button", { type: "submit", class: "primary", id: "wizard-next" }, "Next");
  const saveButton = h("button", { type: "submit", class: "primary", id: "save-trigger" },
    editing ? "Save changes" : "Create trigger");
  const form = h("form", { class: "wizard", id: "trigger-form", novalidate: true },
    indicator, ...panels, reviewPanel,
    h("div", { class: "toolbar wizard-nav" }, backButton, nextButton, saveButton,
      h("a", { class: "button", href: "#/triggers" }, "Cancel")));

  function fill(t) {
    f.id.value = t.id ?? "";
    f.name.value = t.name ?? "";
    f.type.value = t.type ?? "webhook";
    f.enabled.checked = t.enabled !== false;
    f.agent.value = t.agent ?? "";
    f.adapter.value = t.adapter ?? "";
    f.events.value = (t.events ?? []).join(", ");
    const auth = t.auth ?? {};
    const authType = auth.type ?? "none";
    if (![...f.authType.options].some((o) => o.value === authType)) {
      // a type this console does not know (a newer gateway's): offered as it is, its fields kept as stored
      f.authType.append(h("option", { value: authType }, `${authType} (kept as stored)`));
    }
    f.authType.value = authType;
    f.username.value = auth.username ?? "";
    f.header.value = auth.header ?? "";
    f.secretEnv.value = auth[secretEnvField(authType)] ?? "";
    f.tokenEnv.value = auth[tokenEnvField(authType) ?? ""] ?? "";
    f.cron.value = t.cron ?? "";
    f.timezone.value = t.timezone ?? "";
    f.eventType.value = t.event_type === undefined ? "" : [].concat(t.event_type).join(", ");
    f.filter.value = Object.entries(t.filter ?? {}).map(([k, v]) => `${k} = ${v}`).join("\n");
    f.mapping.value = Object.entries(t.input ?? {}).map(([k, v]) => `${k} = ${v}`).join("\n");
    f.prompt.value = t.prompt ?? "";
    f.when.value = t.when ?? "";
    f.dedupe.value = t.deduplication?.ttl_days ?? "";
    f.concurrencyKey.value = t.concurrency?.key ?? "";
    f.concurrencyMode.value = t.concurrency?.policy ?? "queue";
    f.debounce.value = t.concurrency?.debounce_s ?? "";
    f.maxQueued.value = t.concurrency?.max_queued ?? "";
    f.recipients.value = (t.human?.allowed_recipients ?? []).join(", ");
    f.timeout.value = t.human?.default_timeout_s ?? "";
    f.maxTimeout.value = t.human?.max_timeout_s ?? "";
    const onTimeout = t.human?.on_timeout ?? {};
    f.onTimeout.value = onTimeout.action ?? "fail";
    f.defaultOption.value = onTimeout.default_option ?? "";
    f.renotifyEvery.value = onTimeout.renotify?.every_s ?? "";
    f.renotifyMax.value = onTimeout.renotify?.max ?? "";
    f.escalateTo.value = onTimeout.escalate?.to ?? "";
    f.escalateAfter.value = onTimeout.escalate?.after_s ?? "";
  }

  // The trigger as the gateway takes it (JSON): the stored one with the form's fields written over it.
  function spec() {
    const type = f.type.value;
    const out = { ...base };
    for (const [other, names] of Object.entries(TYPE_FIELDS)) if (other !== type) for (const n of names) delete out[n];
    Object.assign(out, { id: editing ? triggerId : f.id.value.trim(), name: f.name.value.trim(), type,
      enabled: f.enabled.checked, agent: f.agent.value.trim() });
    if (type === "webhook") {
      out.adapter = f.adapter.value.trim();
      out.events = listOf(f.events.value);
      const authType = f.authType.value;
      // the stored auth of the same type, every field kept (prefix, encoding, tolerance_s, a newer gateway's…),
      // with the fields the form shows for this type written over it; another type starts empty
      const kept = base.auth?.type === authType ? { ...base.auth } : {};
      const auth = { ...kept, type: authType };
      const written = { username: f.username, header: f.header };
      if (secretEnvField(authType)) written[secretEnvField(authType)] = f.secretEnv;
      if (tokenEnvField(authType)) written[tokenEnvField(authType)] = f.tokenEnv;
      for (const name of authFormFields(authType)) {
        const value = written[name].value.trim();
        if (value) auth[name] = value;
        else delete auth[name];
      }
      out.auth = auth;
    } else if (type === "schedule") {
      out.cron = f.cron.value.trim();
      if (f.timezone.value.trim()) out.timezone = f.timezone.value.trim();
      else delete out.timezone;
    } else {
      const types = listOf(f.eventType.value);
      out.event_type = types.length === 1 ? types[0] : types;
      out.filter = pairsIn(f.filter, "Filter");
    }
    const mapping = pairsIn(f.mapping, "Input mapping");
    if (Object.keys(mapping).length) out.input = mapping;
    else delete out.input;
    const optional = (name, value) => {
      if (value) out[name] = value;
      else delete out[name];
    };
    optional("prompt", f.prompt.value.trim());
    optional("when", f.when.value.trim());
    optional("deduplication", f.dedupe.value ? { ...(base.deduplication ?? {}), ttl_days: Number(f.dedupe.value) } : null);
    const key = f.concurrencyKey.value.trim();
    let concurrency = null;
    if (key) {
      concurrency = { ...(base.concurrency ?? {}), key, policy: f.concurrencyMode.value };
      for (const [name, control] of [["debounce_s", f.debounce], ["max_queued", f.maxQueued]]) {
        if (control.value) concurrency[name] = Number(control.value);
        else delete concurrency[name];
      }
    }
    optional("concurrency", concurrency);
    const human = { ...(base.human ?? {}) };
    human.allowed_recipients = listOf(f.recipients.value);
    if (f.timeout.value) human.default_timeout_s = Number(f.timeout.value);
    else delete human.default_timeout_s;
    if (f.maxTimeout.value) human.max_timeout_s = Number(f.maxTimeout.value);
    else delete human.max_timeout_s;
    // on_timeout as the gateway takes it; a half-filled reminder or escalation goes as written (its 422 names
    // the missing field next to it).
    const onTimeout = { action: f.onTimeout.value };
    if (onTimeout.action === "default" && f.defaultOption.value.trim()) onTimeout.default_option = f.defaultOption.value.trim();
    const numberOf = (control) => (control.value === "" ? undefined : Number(control.value));
    const renotify = { every_s: numberOf(f.renotifyEvery), max: numberOf(f.renotifyMax) };
    if (renotify.every_s !== undefined || renotify.max !== undefined) onTimeout.renotify = renotify;
    const escalate = { to: f.escalateTo.value.trim() || undefined, after_s: numberOf(f.escalateAfter) };
    if (escalate.to !== undefined || escalate.after_s !== undefined) onTimeout.escalate = escalate;
    human.on_timeout = onTimeout;
    out.human = human;
    return out;
  }

  // The control a gateway error's field (``human.on_timeout.renotify.every_s``) belongs to: the longest
  // prefix of fieldControls that names it.
  const fieldControls = [
    ["id", f.id], ["name", f.name], ["type", f.type], ["agent", f.agent], ["adapter", f.adapter],
    ["events", f.events], ["auth.username", f.username], ["auth.header", f.header], ["auth.password_env", f.secretEnv],
    ["auth.token_env", f.secretEnv], ["auth.secret_env", f.secretEnv], ["auth", f.authType], ["cron", f.cron],
    ["timezone", f.timezone], ["event_type", f.eventType], ["filter", f.filter], ["input", f.mapping],
    ["prompt", f.prompt], ["when", f.when], ["deduplication", f.dedupe], ["concurrency.key", f.concurrencyKey],
    ["concurrency.policy", f.concurrencyMode], ["concurrency.debounce_s", f.debounce],
    ["concurrency.max_queued", f.maxQueued], ["concurrency", f.concurrencyKey],
    ["human.allowed_recipients", f.recipients], ["human.default_timeout_s", f.timeout],
    ["human.max_timeout_s", f.maxTimeout],
    ["human.on_timeout.action", f.onTimeout], ["human.on_timeout.default_option", f.defaultOption],
    ["human.on_timeout.renotify.every_s", f.renotifyEvery], ["human.on_timeout.renotify.max", f.renotifyMax],
    ["human.on_timeout.renotify", f.renotifyEvery], ["human.on_timeout.escalate.to", f.escalateTo],
    ["human.on_timeout.escalate.after_s", f.escalateAfter], ["human.on_timeout.escalate", f.escalateTo],
    ["human.on_timeout", f.onTimeout],
  ];
  function controlOf(error) {
    if (error.control) return error.control; // the console's own check named it
    const path = String(error.field ?? "");
    // "action 'default' needs default_option" is said of on_timeout as a whole: it is the option's field
    if (path === "human.on_timeout" && /default_option/.test(error.message ?? "")) return f.defaultOption;
    if (path === "human" && /default_timeout_s/.test(error.message ?? "")) return f.timeout; // > max_timeout_s
    const mindmap = f.authType.value === "mindmap";
    if (path === "auth" && /(password|token|secret)_env/.test(error.message ?? "")) { // not set, or neither given
      return mindmap && /token_env/.test(error.message) && !/secret_env/.test(error.message) ? f.tokenEnv : f.secretEnv;
    }
    if (mindmap && (path === "auth.token_env" || path === "auth.token")) return f.tokenEnv;
    let best = null;
    for (const [prefix, control] of fieldControls) {
      const fits = path === prefix || path.startsWith(`${prefix}.`) || path.startsWith(`${prefix}[`);
      if (fits && (!best || prefix.length > best[0].length)) best = [prefix, control];
    }
    return best?.[1] ?? null;
  }

  function clearMarks() {
    for (const [control, error] of problems) {
      control.removeAttribute("aria-invalid");
      error.hidden = true;
      error.textContent = "";
    }
  }

  // Each error next to its field (marked aria-invalid); the wizard shows the earliest step with a marked field
  // and its first marked field takes the focus. Returns how many errors found a field.
  function markErrors(errors) {
    clearMarks();
    const marked = [];
    for (const error of errors ?? []) {
      const control = controlOf(error);
      const line = control ? problems.get(control) : null;
      if (!line) continue;
      control.setAttribute("aria-invalid", "true");
      const text = error.field ? `${error.field}: ${error.message}` : error.message;
      line.textContent = line.textContent ? `${line.textContent}; ${error.message}` : text;
      line.hidden = false;
      marked.push(control);
    }
    if (!marked.length) return 0;
    const step = Math.min(...marked.map((c) => stepOf.get(c) ?? REVIEW));
    if (step !== current) showStep(step, { focus: false });
    // the first marked field of that step, in page order
    const first = controls(step).find((c) => marked.includes(c));
    first?.focus();
    return marked.length;
  }

  function fieldErrors(errors) {
    return h("ul", { class: "errors" }, (errors ?? []).map((e) => h("li", {}, `${e.field}: ${e.message}`)));
  }

  // ---- the steps: which step each control is on, showing one, checking one
  const stepOf = new Map(); // control -> its step's index
  panels.forEach((panel, i) => {
    for (const control of panel.querySelectorAll("input, select, textarea")) stepOf.set(control, i);
  });
  const shown = (node) => node.getClientRects().length > 0; // not inside a hidden part
  const controls = (i) => [...stepOf].filter(([c, step]) => step === i && shown(c) && !c.disabled).map(([c]) => c);
  let current = 0;
  let reached = editing ? REVIEW : 0; // the furthest step opened: the indicator goes there directly
  let busy = false;

  function showStep(i, { focus = true } = {}) {
    current = i;
    reached = Math.max(reached, i);
    panels.forEach((panel, n) => { panel.hidden = n !== i; });
    reviewPanel.hidden = i !== REVIEW;
    stepButtons.forEach((button, n) => {
      if (n === i) button.setAttribute("aria-current", "step");
      else button.removeAttribute("aria-current");
      button.disabled = n > reached;
      button.dataset.done = String(n < reached && n !== i);
    });
    backButton.hidden = i === 0;
    nextButton.hidden = i === REVIEW;
    saveButton.hidden = i !== REVIEW;
    if (i === REVIEW) renderReview();
    if (!focus) return;
    // the step's first field (a screen reader announces its step's legend with it); the review: its heading
    const first = i === REVIEW ? null : controls(i)[0];
    (first ?? (i === REVIEW ? reviewTitle : $(`wizard-step-${i + 1}-title`))).focus();
  }

  // The draft through the gateway's preview (nothing saved): its word on every field, as a save would say it.
  // ``payload``: the sample (step 4), else an empty body (the answer's payload stage then says nothing of the
  // trigger). Errors of a schedule the preview cannot run ("only webhook and event triggers…") are not errors.
  async function gatewaySays(draft, payload) {
    const body = { trigger: draft, payload };
    const headers = current === 3 ? headersOf(f.headers.value) : {};
    if (Object.keys(headers).length) body.headers = headers;
    const answer = await api(`${GATEWAY}/preview`, { method: "POST", body, signal });
    if (Array.isArray(answer.errors)) answer.errors = errorsInWords(answer.errors);
    if (answer.ok || !["trigger", "mapping"].includes(answer.stage)) return { answer, errors: [] };
    const errors = answer.errors.filter((e) => !/^only webhook and event triggers can be previewed/.test(e.message));
    return { answer, errors };
  }

  // Checks step ``i``'s fields: the browser's constraints (required, pattern, number bounds), the lines the form
  // parses, then the gateway's word on the draft -- errors of this step or an earlier one stop; a later step's
  // (a required field not filled yet) wait for that step. True when the step may be left forward.
  async function checkStep(i) {
    clearMarks();
    message(null);
    const local = controls(i).filter((c) => !c.checkValidity())
      .map((c) => ({ control: c, field: "", message: c.validity.patternMismatch && c.dataset.words
        ? `must be ${c.dataset.words}` : c.validationMessage }));
    if (i === 3 && f.sample.value.trim()) {
      try { JSON.parse(f.sample.value); } catch (error) {
        local.push({ control: f.sample, field: "", message: `not JSON: ${error.message}` });
      }
      try { headersOf(f.headers.value); } catch (error) { local.push({ control: f.headers, field: "", message: error.message }); }
    }
    if (local.length) {
      say(i, local);
      return markErrors(local) === 0;
    }
    let draft;
    try {
      draft = spec();
    } catch (error) {
      if (error.control && (stepOf.get(error.control) ?? REVIEW) <= i) {
        const problem = [{ control: error.control, field: "", message: error.message }];
        say(i, problem);
        markErrors(problem);
        return false;
      }
      return true; // a later step's lines: checked there
    }
    let said;
    try {
      if (i === 3 && f.sample.value.trim() && f.type.value !== "schedule") said = await preview(draft);
      else said = await gatewaySays(draft, {});
    } catch (error) {
      failed(error);
      return false;
    }
    const mine = said.errors.filter((e) => {
      const control = controlOf(e);
      return control !== null && (stepOf.get(control) ?? REVIEW) <= i;
    });
    if (mine.length) {
      say(Math.min(...mine.map((e) => stepOf.get(controlOf(e)) ?? i)), mine);
      markErrors(mine);
      return false;
    }
    if (i === 0 && !editing) { // the id is free? (the gateway would answer 409 at the save)
      try {
        await api(`${GATEWAY}/${encodeURIComponent(f.id.value.trim())}`, { signal });
        const taken = [{ control: f.id, field: "id", message: "a trigger with this id exists already (Edit it in the list)" }];
        say(0, taken);
        markErrors(taken);
        return false;
      } catch (error) {
        if (!(error instanceof ApiError && error.status === 404)) {
          failed(error);
          return false;
        }
      }
    }
    return true;
  }

  // The alert line: which step, which fields (by the gateway's path, else the field's label), and why.
  function say(i, errors) {
    const name = (e) => e.field || document.querySelector(`label[for="${e.control?.id}"]`)?.textContent || "";
    message(`Check step ${i + 1} (${WIZARD_STEPS[i]}): ${errors.map((e) => `${name(e)}: ${e.message}`).join("; ")}`);
  }

  async function next() {
    if (busy) return;
    busy = true;
    nextButton.disabled = true;
    try {
      if (await checkStep(current)) showStep(current + 1);
    } finally {
      busy = false;
      nextButton.disabled = false;
    }
  }

  // The indicator: back (or to the review of an edit) without a check of the step left behind when going back;
  // forward, the step being left is checked first.
  async function jump(i) {
    if (busy || i === current || i > reached) return;
    if (i < current) {
      clearMarks();
      showStep(i);
      return;
    }
    busy = true;
    try {
      if (await checkStep(current)) showStep(i);
    } finally {
      busy = false;
    }
  }
  backButton.addEventListener("click", () => {
    if (busy || current === 0) return;
    clearMarks();
    message(null);
    showStep(current - 1);
  });

  // ---- the review: what will be saved, in words, each step one click away; the JSON sent below it
  function renderReview() {
    let t;
    try {
      t = spec();
    } catch (error) {
      reviewBody.replaceChildren(h("p", { class: "bad" }, error.message));
      return;
    }
    const list = (items) => (items?.length ? items.join(", ") : "—");
    const lines = (obj) => (obj && Object.keys(obj).length ? Object.entries(obj).map(([k, v]) => `${k} = ${v}`).join("\n") : null);
    const source = { webhook: "a webhook", schedule: "a schedule", event: "Temporality's own events" }[t.type] ?? t.type;
    const auth = t.auth ? [t.auth.type, t.auth.username, t.auth.header,
      t.auth[secretEnvField(t.auth.type)] ? `secret in $${t.auth[secretEnvField(t.auth.type)]}` : null]
      .filter(Boolean).join(" · ") : null;
    const seconds = (n) => `${duration(n)} (${n} s)`;
    const human = t.human ?? {};
    const ot = human.on_timeout ?? {};
    const unauthenticated = t.type === "webhook" && t.auth?.type === "none";
    const sections = [
      [["Trigger", `${t.id} — ${t.name}`], ["Comes from", source], ["Adapter", t.adapter],
        ["Auth", unauthenticated ? h("span", { class: "bad", id: "review-auth-none" }, `none — ${NO_AUTH_WARNING}`) : auth],
        ["Enabled", t.enabled === false ? "no" : "yes"]],
      [["Event types", t.type === "webhook" ? list(t.events) : null],
        ["Schedule", t.type === "schedule" ? `${t.cron}${t.timezone ? ` (${t.timezone})` : " (UTC)"}` : null],
        ["Event type", t.type === "event" ? list([t.event_type].flat()) : null],
        ["Filter", t.type === "event" ? lines(t.filter) ?? "none" : null],
        ["Condition", t.when ?? "every event"], ["Duplicates remembered", `${t.deduplication?.ttl_days ?? 7} days`]],
      [["Agent", t.agent], ["Runs at the same time", t.concurrency
        ? `one per ${t.concurrency.key}; then ${t.concurrency.policy}${t.concurrency.debounce_s ? `, debounce ${duration(t.concurrency.debounce_s)}` : ""}`
        : "no limit"]],
      [["Input", lines(t.input) ?? "the payload as it is"], ["Prompt", t.prompt ?? "none"]],
      [["May ask", list(human.allowed_recipients)], ["Default timeout", seconds(human.default_timeout_s ?? 3600)],
        ["Maximum timeout", seconds(human.max_timeout_s ?? 7 * 24 * 3600)]],
      [["At the deadline", `${ON_TIMEOUT[ot.action] ?? ot.action}${ot.default_option ? ` (${ot.default_option})` : ""}`],
        ["Reminders", ot.renotify ? `every ${seconds(ot.renotify.every_s)}, at most ${ot.renotify.max}` : "none"],
        ["Escalation", ot.escalate ? `to ${ot.escalate.to} after ${seconds(ot.escalate.after_s)}` : "none"]],
    ];
    reviewBody.replaceChildren(
      ...sections.map((pairs, i) => h("div", { class: "card review-step", dataset: { step: i + 1 } },
        h("div", { class: "toolbar" }, h("h3", {}, `${i + 1}. ${WIZARD_STEPS[i]}`),
          h("button", { type: "button", "aria-label": `Change step ${i + 1}: ${WIZARD_STEPS[i]}`,
            onclick: () => jump(i) }, "Change")),
        facts(pairs.filter(([, v]) => v !== null && v !== undefined)))),
      h("details", {}, h("summary", {}, "The trigger as it is sent (JSON)"),
        h("pre", { id: "wizard-json" }, JSON.stringify(t, null, 2))));
  }

  // The mapping preview on the sample: renders the answer, returns it with the errors it names.
  async function preview(draft) {
    const payload = JSON.parse(f.sample.value || "{}");
    previewOut.replaceChildren("Previewing…");
    let said;
    try {
      said = await gatewaySays(draft, payload);
    } catch (error) {
      previewOut.replaceChildren();
      throw error;
    }
    const { answer } = said;
    if (!answer.ok) {
      previewOut.replaceChildren(h("p", { class: "bad" }, `The ${answer.stage} is not valid:`), fieldErrors(answer.errors));
    } else if (!answer.would_start_run) {
      previewOut.replaceChildren(h("p", {}, `No run: ${answer.ignored?.reason ?? "ignored"}`,
        answer.ignored?.detail ? ` — ${answer.ignored.detail}` : ""));
    } else {
      previewOut.replaceChildren(
        h("p", { class: "ok" }, `Would start a run: ${answer.title ?? answer.run_id ?? ""}`),
        h("h3", {}, "Agent input"), h("pre", { id: "preview-input" }, JSON.stringify(answer.input, null, 2)),
        h("h3", {}, "Normalized event"), h("pre", { id: "preview-event" }, JSON.stringify(answer.event, null, 2)));
    }
    return said;
  }

  previewButton.addEventListener("click", async () => {
    message(null);
    clearMarks();
    let draft;
    try {
      draft = spec();
      JSON.parse(f.sample.value || "{}");
      headersOf(f.headers.value);
    } catch (error) {
      previewOut.replaceChildren(h("p", { class: "bad" }, `Not previewed: ${error.message}`));
      return;
    }
    try {
      const { errors } = await preview(draft);
      const where = errors.map(controlOf);
      // the fields of this step are marked here; another step's error stays in the list above (its step marks it)
      markErrors(errors.filter((e, n) => where[n] !== null && stepOf.get(where[n]) === current));
      if (errors.length && !errors.some((e, n) => where[n] !== null && stepOf.get(where[n]) === current)) previewButton.focus();
    } catch (error) {
      if (error instanceof ApiError && error.status !== 401 && error.status !== 403) {
        previewOut.replaceChildren(h("p", { class: "bad" }, `${detailInWords(error.message)} (${error.status} ${error.code})`),
          fieldErrors(errorsInWords(error.body?.errors)));
      } else failed(error);
    }
  });

  async function save() {
    message(null);
    clearMarks();
    let body;
    try {
      body = spec();
    } catch (error) {
      if (error.control) markErrors([{ control: error.control, field: "", message: error.message }]);
      message(error.message);
      return;
    }
    busy = true;
    saveButton.disabled = true;
    try {
      const path = editing ? `${GATEWAY}/${encodeURIComponent(triggerId)}` : GATEWAY;
      const saved = await api(path, { method: editing ? "PUT" : "POST", body, signal, ifMatch: editing ? etag : null });
      // a new trigger is "created" (the gateway's revision numbers are its store's: a new one may start above 1)
      go("#/triggers", editing
        ? `Trigger ${saved.trigger.id} saved: now revision ${saved.revision}.`
        : `Trigger ${saved.trigger.id} created.`, "success");
    } catch (error) {
      if (error instanceof ApiError && error.status === 412) {
        message("Someone else changed this trigger since you opened it (412). Reload it to see their version, then edit again.");
        if (!$("reload-trigger")) {
          saveButton.after(h("button", { type: "button", id: "reload-trigger", onclick: () => go(location.hash) }, "Reload"));
        }
      } else if (error instanceof ApiError && error.status === 422) {
        message(`Not saved: ${detailInWords(error.message)} (422).`);
        markErrors(errorsInWords(error.body?.errors));
      } else failed(error);
    } finally {
      busy = false;
      saveButton.disabled = false;
    }
  }

  // Enter in a field is the step's Next (after its check), never an early save; the review's Save saves.
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (busy) return;
    if (current < REVIEW) next();
    else save();
  });

  const start = () => {
    showParts();
    showAuth();
    showDefault();
    showStep(0);
  };
  if (!editing) {
    root.replaceChildren(form);
    start();
    return;
  }
  apiWithEtag(`${GATEWAY}/${encodeURIComponent(triggerId)}`, { signal }).then(({ data, etag: tag }) => {
    base = { ...data.trigger };
    etag = tag;
    fill(base);
    root.replaceChildren(
      data.write_only_set?.length
        ? h("p", { class: "muted" }, `Kept as stored (write-only): ${data.write_only_set.join(", ")}.`) : "",
      form);
    start();
  }).catch((error) => {
    root.replaceChildren();
    gatewayFailed(error, root);
  });
}

// ------------------------------------------------------------------ analytics (OBS-1)
function bars(rows) {
  const max = Math.max(1, ...rows.map(([, n]) => n));
  return h("div", { class: "bars" }, rows.map(([label, n]) => [
    h("span", {}, label),
    h("div", { class: "bar-fill", style: { width: `${(100 * n) / max}%` }, role: "img", "aria-label": `${label}: ${n}` }),
    h("span", { class: "num" }, n),
  ]));
}

// OBS-1 "at which stage": the run's model turn each question was asked in (human.requested.turn) — the one
// stage the events carry; a chart of the questions per turn and a table with their outcomes and median wait.
function stages(rows) {
  if (!rows.length) return h("p", { class: "empty", id: "stages" }, "No questions yet.");
  const label = (r) => (r.turn === null ? "turn unknown" : `turn ${r.turn}`);
  const percent = (x) => (x === null || x === undefined ? "—" : `${Math.round(x * 1000) / 10} %`);
  const share = (r) => percent(r.asked_share);
  return h("div", { id: "stages" },
    bars(rows.map((r) => [label(r), r.requests_total])),
    h("table", { class: "stages" },
      h("caption", { class: "muted" }, "Questions asked at each turn; runs: those that asked at that turn, of all "
        + "runs, and of the runs that got that far (a run still going counts up to the latest turn it asked in)"),
      h("thead", {}, h("tr", {}, h("th", {}, "Stage"), h("th", { class: "num" }, "Questions"),
        h("th", { class: "num" }, "Runs that asked"), h("th", { class: "num" }, "Of all runs"),
        h("th", { class: "num" }, "Runs that got this far"), h("th", { class: "num" }, "Of those"),
        h("th", { class: "num" }, "Answered"), h("th", { class: "num" }, "Expired"),
        h("th", { class: "num" }, "Refused"), h("th", { class: "num" }, "Withdrawn"),
        h("th", { class: "num" }, "Pending"), h("th", { class: "num" }, "Median wait"))),
      h("tbody", {}, rows.map((r) => h("tr", { dataset: { turn: r.turn ?? "" } },
        h("th", { scope: "row" }, label(r)), h("td", { class: "num" }, r.requests_total),
        h("td", { class: "num" }, r.runs_asked), h("td", { class: "num" }, share(r)),
        h("td", { class: "num" }, r.runs_reached ?? "—"), h("td", { class: "num" }, percent(r.reached_share)),
        h("td", { class: "num" }, r.answered), h("td", { class: "num" }, r.expired),
        h("td", { class: "num" }, r.rejected), h("td", { class: "num" }, r.withdrawn),
        h("td", { class: "num" }, r.pending), h("td", { class: "num" }, duration(r.wait_p50_s)))))));
}

// OBS-1 "which knowledge is missing, which decisions are delegated": why agents ask (ask_human's reason_kind and
// reason), and for each of the most delegated questions which options people chose (answers per option).
// Self-contained: one call in analyticsView's render.
const REASON_KINDS = { missing_knowledge: "missing knowledge", decision: "decision", approval: "approval",
  ambiguity: "ambiguity" };
function delegation(a) {
  const kindName = (k) => (k === null || k === undefined ? "not given" : REASON_KINDS[k] ?? k);
  const kinds = a.by_reason_kind ?? [];
  const reasons = a.top_reasons ?? [];
  const questions = (a.top_questions ?? []).filter((q) => q && typeof q === "object");
  const chosen = questions.filter((q) => (q.choices ?? []).length || q.free_text);
  const num = (v) => h("td", { class: "num" }, v ?? "—");
  const percent = (x) => (x === null || x === undefined ? "—" : `${Math.round(x * 1000) / 10} %`);
  return h("div", { id: "delegation" },
    h("h2", { id: "why-agents-ask" }, "Why agents ask"),
    kinds.length ? [
      bars(kinds.map((k) => [kindName(k.reason_kind), k.requests_total])),
      h("table", { class: "reason-kinds" },
        h("thead", {}, h("tr", {}, h("th", {}, "Kind"), h("th", { class: "num" }, "Questions"),
          h("th", { class: "num" }, "Runs"), h("th", { class: "num" }, "Answered"), h("th", { class: "num" }, "Expired"),
          h("th", { class: "num" }, "Pending"), h("th", { class: "num" }, "Median wait"))),
        h("tbody", {}, kinds.map((k) => h("tr", { dataset: { kind: k.reason_kind ?? "" } },
          h("th", { scope: "row" }, kindName(k.reason_kind)), num(k.requests_total), num(k.runs_asked),
          num(k.answered), num(k.expired), num(k.pending), num(duration(k.wait_p50_s)))))),
    ] : h("p", { class: "empty" }, "No questions yet."),
    reasons.length
      ? h("ol", { class: "top-reasons", id: "top-reasons" }, reasons.map((r) => h("li", {},
        uncut(r.reason), ` — ${r.count}×`, h("span", { class: "muted" }, ` (${kindName(r.reason_kind)})`))))
      : h("p", { class: "muted" }, "No agent gave a reason yet (ask_human's reason)."),
    h("h2", { id: "what-people-chose" }, "What people chose"),
    chosen.length ? h("div", { id: "choices" }, chosen.map((q) => h("section", { class: "choice" },
      h("h3", {}, uncut(q.question ?? "—"), h("span", { class: "muted" }, ` — ${q.answered ?? 0} answered of ${q.count}`)),
      q.reason ? h("p", { class: "muted" }, `Why asked: ${q.reason} (${kindName(q.reason_kind)})`) : null,
      h("table", { class: "choices" },
        h("thead", {}, h("tr", {}, h("th", {}, "Option"), h("th", { class: "num" }, "Chosen"),
          h("th", { class: "num" }, "Share"), h("th", { class: "num" }, "Timeout default"),
          h("th", { class: "num" }, "Offered"))),
        h("tbody", {},
          (q.choices ?? []).map((c) => h("tr", { dataset: { option: c.option_id } },
            h("th", { scope: "row" }, c.label ? `${c.label} [${c.option_id}]` : c.option_id), num(c.chosen),
            num(percent(c.share)), num(c.defaulted), num(c.offered))),
          q.free_text ? h("tr", { dataset: { option: "" } }, h("th", { scope: "row" }, "free text"),
            num(q.free_text), num(percent(q.answered ? q.free_text / q.answered : null)), num(""), num("")) : null)))))
      : h("p", { class: "empty" }, "No answers yet."));
}

// The Analytics page's periods: the runs created in the last 24 h / 7 d / 30 d (the window slides with each
// refresh), all of them, or from / before instants -- in the address with their offset (shareable across zones; an older link without one is local time).
const PERIODS = { "24h": ["the last 24 hours", 24 * 3600], "7d": ["the last 7 days", 7 * 24 * 3600],
  "30d": ["the last 30 days", 30 * 24 * 3600] };

// The API's since / until (ISO) of the page's address, and the period in words.
export function analyticsPeriod(params, now = Date.now()) {
  const period = params.get("period");
  if (Object.hasOwn(PERIODS, period)) {
    const [words, seconds] = PERIODS[period];
    return { since: new Date(now - seconds * 1000).toISOString(), until: null, words: `Runs created in ${words}` };
  }
  const at = (name) => {
    const local = instantParam(params.get(name));
    return local && !Number.isNaN(Date.parse(local)) ? new Date(local).toISOString() : null;
  };
  const since = at("since");
  const until = at("until");
  if (!since && !until) return { since: null, until: null, words: "All runs" };
  const words = since && until ? `Runs created from ${when(since)} to before ${when(until)}`
    : since ? `Runs created since ${when(since)}` : `Runs created before ${when(until)}`;
  return { since, until, words };
}

function periodForm(params) {
  const chosen = Object.hasOwn(PERIODS, params.get("period")) ? params.get("period")
    : params.get("since") || params.get("until") ? "range" : "";
  const period = h("select", { name: "period", id: "analytics-period" },
    h("option", { value: "", selected: chosen === "" }, "all time"),
    Object.entries(PERIODS).map(([value, [words]]) => h("option", { value, selected: chosen === value }, words)),
    h("option", { value: "range", selected: chosen === "range" }, "from … to …"));
  const date = (name) => h("input", { name, type: "datetime-local", value: localField(params.get(name)),
    disabled: chosen !== "range" });
  const since = date("since");
  const until = date("until");
  period.addEventListener("change", () => {
    since.disabled = until.disabled = period.value !== "range";
  });
  const form = h("form", { class: "filters period", id: "analytics-filters", "aria-label": "Which runs" },
    h("label", {}, "Period", period), h("label", {}, "From", since), h("label", {}, "Before", until),
    h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (period.value === "range") {
      if (since.value) next.set("since", withOffset(since.value));
      if (until.value) next.set("until", withOffset(until.value));
    } else if (period.value) next.set("period", period.value);
    const hash = `#/analytics${next.size ? `?${next}` : ""}`;
    if (location.hash === hash) go(hash);
    else location.hash = hash;
  });
  return form;
}

// One of the most delegated questions, whatever the API says of it: its text (``question``, or an ``example`` of
// the group), how often, an example worded otherwise when the group has one, and whose it is -- the API groups
// the questions per trigger and agent, so the same question asked by two triggers' runs is two rows, told apart
// by "asked by <agent> for <trigger>".
function topQuestion(q) {
  const item = q && typeof q === "object" ? q : { question: q };
  const text = [item.question, item.example, item.text, item.label].find((v) => typeof v === "string" && v) ?? "—";
  const count = [item.count, item.requests, item.total].find((v) => typeof v === "number");
  const example = typeof item.example === "string" && item.example && item.example !== text ? item.example : null;
  const whose = [item.agent ? `asked by ${item.agent}` : null,
    item.trigger_id ? `for trigger ${item.trigger_id}` : item.agent ? "without a trigger" : null].filter(Boolean);
  return h("li", { dataset: { agent: item.agent ?? "", triggerId: item.trigger_id ?? "" } },
    h("span", { class: "question-text" }, uncut(text)), count === undefined ? "" : ` — ${count}×`,
    example ? h("span", { class: "muted example" }, `e.g. “${uncut(example)}”`) : null,
    whose.length ? h("span", { class: "muted asked-by" }, whose.join(" ")) : null);
}

function analyticsView(signal, query) {
  const params = new URLSearchParams(query);
  const root = h("div", { id: "analytics" }, "Loading…");
  const scope = h("p", { class: "muted", id: "analytics-scope", role: "status" });
  show(h("h1", {}, "How often runs need people"), periodForm(params), scope, root);
  const render = (a) => {
    const share = a.asked_share === null ? "—" : `${Math.round(a.asked_share * 1000) / 10} %`;
    const histogram = a.wait.histogram.map((b, i, all) => {
      const low = i === 0 ? 0 : all[i - 1].lt_s;
      return [b.lt_s === null ? `≥ ${duration(low)}` : `< ${duration(b.lt_s)}`, b.count];
    });
    const breakdown = (rows, label) => h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, label), h("th", { class: "num" }, "Runs"),
        h("th", { class: "num" }, "Completed"), h("th", { class: "num" }, "Failed"), h("th", { class: "num" }, "Cancelled"),
        h("th", { class: "num" }, "Asked"),
        h("th", { class: "num" }, "Share"), h("th", { class: "num" }, "Answered"), h("th", { class: "num" }, "Expired"),
        h("th", { class: "num" }, "Withdrawn"), h("th", { class: "num" }, "Pending"),
        h("th", { class: "num" }, "Escalated"))),
      h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, r.key ?? "—"), h("td", { class: "num" }, r.runs_total),
        h("td", { class: "num" }, r.runs_completed ?? "—"), h("td", { class: "num" }, r.runs_failed ?? "—"),
        h("td", { class: "num" }, r.runs_cancelled ?? "—"),
        h("td", { class: "num" }, r.runs_asked),
        h("td", { class: "num" }, r.asked_share === null ? "—" : `${Math.round(r.asked_share * 100)} %`),
        h("td", { class: "num" }, r.answered), h("td", { class: "num" }, r.expired),
        h("td", { class: "num" }, r.withdrawn), h("td", { class: "num" }, r.pending),
        h("td", { class: "num" }, r.escalated ?? 0)))));
    root.replaceChildren(
      h("div", { class: "card" }, facts([
        ["Runs", a.runs_total], ["Runs that asked a human", `${a.runs_asked} (${share})`],
        ["Requests", a.requests_total], ["Answered", a.answered], ["Timed out", a.expired],
        ["Refused", a.rejected], ["Withdrawn (the run ended first)", a.withdrawn], ["Pending", a.pending],
        ["Escalated / reminders sent", `${a.escalated ?? 0} / ${a.reminders ?? 0}`],
        ["Wait p50 / p90 / max", `${duration(a.wait.p50_s)} / ${duration(a.wait.p90_s)} / ${duration(a.wait.max_s)}`],
      ])),
      h("h2", {}, "Outcomes of human requests"),
      bars([["answered", a.answered], ["timed out", a.expired], ["refused", a.rejected], ["withdrawn", a.withdrawn],
        ["pending", a.pending]]),
      h("h2", {}, "Wait times (answered requests)"),
      bars(histogram),
      h("h2", {}, "Most delegated questions"),
      (a.top_questions ?? []).length
        ? h("ol", { class: "top-questions", id: "top-questions" }, a.top_questions.map(topQuestion))
        : h("p", { class: "empty" }, "No questions yet."),
      h("h2", {}, "Per agent"), breakdown(a.by_agent, "Agent"),
      h("h2", {}, "Per trigger"), breakdown(a.by_trigger, "Trigger"),
      h("h2", { id: "per-stage" }, "Per stage: the turn of the run a question was asked in"),
      stages(a.by_stage ?? []),
      delegation(a),
    );
  };
  const load = () => {
    const { since, until, words } = analyticsPeriod(params);
    const ask = new URLSearchParams();
    if (since) ask.set("since", since);
    if (until) ask.set("until", until);
    return api(`/analytics/human${ask.size ? `?${ask}` : ""}`, { signal }).then((a) => {
      if (scope.textContent !== words) scope.textContent = words;
      render(a);
    }).catch(failed);
  };
  load();
  const refresh = debounce(load, 1000);
  tail({}, (e) => (movesAnalytics(e.type) ? refresh() : null), signal, refresh);
}

// ------------------------------------------------------------------ the web inbox (UI-1 / HUM)
// A person answers their own questions here. They sign in with their *inbox token* (their directory
// profile's inbox_token), not an API token: a separate sign-in, kept under its own key in this tab. The
// journal forwards /human/... to human-interaction, which checks the token and shows only their questions.
const INBOX_TOKEN_KEY = "temporality.console.inbox-token";
const inboxToken = () => sessionStorage.getItem(INBOX_TOKEN_KEY);
// Why human-interaction refused an answer, in the person's words (the detail follows).
const REFUSALS = {
  already_answered: "Already answered",
  expired: "Too late: the question expired",
  cancelled: "The question was withdrawn",
  not_recipient: "Not yours to answer",
  unknown_request: "No such question",
  invalid_answer: "That answer does not fit",
};

async function inboxApi(path, { method = "GET", body, signal, tokenOverride } = {}) {
  return api(path, { method, body, signal, tokenOverride: tokenOverride ?? inboxToken() ?? "" });
}

function inboxFailed(error) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401 && signedInPerson() && !inboxToken()) {
    signOut(`Not signed in: ${error.message} (401). Sign in again.`);
  } else if (error instanceof ApiError && error.status === 401) {
    sessionStorage.removeItem(INBOX_TOKEN_KEY);
    go("#/inbox", `Inbox: not signed in: ${error.message} (401). Sign in with your inbox token.`);
  } else if (error instanceof ApiError) {
    message(`Inbox: ${error.message} (${error.status} ${error.code}).`);
  } else if (error instanceof NoAnswer) {
    noAnswer(error);
  } else {
    message(`Something went wrong in this page: ${error?.message || error}.`);
  }
}

function inboxSignInView() {
  const input = h("input", {
    id: "inbox-token",
    name: "inbox-token",
    type: "password",
    autocomplete: "off",
    required: true,
    "aria-describedby": "inbox-token-help",
  });
  const form = h(
    "form",
    { class: "signin card", id: "inbox-signin" },
    h("h1", {}, "Your inbox: sign in"),
    h("label", { for: "inbox-token" }, "Inbox token", input),
    h(
      "p",
      { id: "inbox-token-help", class: "muted" },
      "Your personal inbox token (from your user profile), to answer the questions agents ask you. " +
        "This is not an operator's API token. It is kept in this browser tab only.",
    ),
    h("button", { class: "primary", type: "submit" }, "Open my inbox"),
  );
  const page = h("div", { class: "signin-page" }, form);
  Promise.all([providerButton(), directoryForm()]).then(([button, directory]) => {
    if (directory) {
      const heading = form.querySelector("h1");
      page.prepend(heading, directory, h("p", { class: "muted" }, "Or with your inbox token:"));
    }
    if (button) {
      page.querySelector("h1").after(button, h("p", { class: "muted" }, directory ? "Or:" : "Or with your inbox token:"));
    }
  }).catch(() => {});
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    try {
      await inboxApi("/human/inbox", { tokenOverride: candidate });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        message(`That inbox token was refused: ${error.message} (401).`);
      } else inboxFailed(error);
      input.select();
      return;
    }
    sessionStorage.setItem(INBOX_TOKEN_KEY, candidate);
    go("#/inbox");
  });
  show(page);
  input.focus();
}

function optionLabel(item, optionId) {
  return item.options.find((o) => o.id === optionId)?.label ?? optionId;
}

// What happens at the deadline when nobody answered, without the deadline itself (the card says it once, in this
// browser's time with its zone, from expires_at): the question's own at_deadline (human-interaction: action and
// default option as they apply to it) -- not its ``text``, which repeats the deadline in UTC for the chats --, and
// the reminders and escalation before it from the journal's on_timeout (the policy of its human.requested).
export function atDeadline(item) {
  const policy = item.on_timeout ?? null;
  const action = item.at_deadline?.action ?? policy?.action ?? null;
  const option = item.at_deadline ? item.at_deadline.default_option : policy?.default_option;
  const then = action === "default" && option ? `the run goes on with “${optionLabel(item, option)}”`
    : action === "cancel" ? "the run is cancelled"
    : action === "fail" || action === "default" ? "the run stops without your answer"
    : null;
  if (!then) return "What happens without an answer is not known yet.";
  // the chain's steps as human-interaction plans them (chain.plan): the reminders every every_s from the question,
  // the escalation after_s after the last of them; only those before the deadline happen
  const before = [];
  const asked = Date.parse(item.created_at);
  const due = Date.parse(item.expires_at);
  const known = !Number.isNaN(asked) && !Number.isNaN(due);
  let at = asked;
  const every = Number(policy?.renotify?.every_s);
  if (every > 0) {
    const max = Number(policy.renotify.max) || 1;
    const sent = known ? Math.min(max, Math.max(0, Math.ceil((due - asked) / (1000 * every)) - 1)) : max;
    if (sent) before.push(`you are reminded every ${duration(every)} (at most ${sent} ${sent === 1 ? "time" : "times"})`);
    at += 1000 * every * max;
  }
  if (policy?.escalate?.to) {
    at += 1000 * Number(policy.escalate.after_s);
    if (!known) before.push(`it also goes to ${person(policy.escalate.to)}`);
    else if (at < due) before.push(`it also goes to ${person(policy.escalate.to)} at ${when(new Date(at).toISOString())}`);
  }
  return `${before.length ? `Before then, ${before.join(" and ")}. ` : ""}Without an answer by then, ${then}.`;
}

// A request with a form (``form``: the fields of its ``answer_schema``, an MCP elicitation's requested schema):
// one labelled input per field, the required ones marked. The answer goes out as one text, a JSON object of
// the typed values ({"replicas": 3, "approve": true}), which human-interaction reads exactly as the
// run-executor will (temporality_protocol.forms) and refuses with 422 invalid_answer naming the field when
// it does not fit: the console checks nothing but required fields (the browser's own check), the server says
// what is wrong, and the field it names is marked and focused.
const FORM_MISFIT = /^the answer does not fit the form: /;
const NUMBER_KINDS = { integer: "numeric", number: "decimal" };

function formValue(field, control) {
  const raw = control.value;
  if (field.choices) return raw === "" ? undefined : field.choices[Number(raw)].value;
  const text = raw.trim();
  if (!text) return undefined;
  if (field.type === "integer") return /^[+-]?\d+$/.test(text) ? Number(text) : text; // else the server says why
  if (field.type === "number") return Number.isFinite(Number(text)) ? Number(text) : text;
  if (field.type === "array") return text.split(",").map((part) => part.trim()).filter(Boolean);
  return text;
}

function formShown(field, value) {
  const choice = field.choices?.find((c) => c.value === value);
  const label = field.title || field.name;
  return `${label}: ${choice ? choice.label : Array.isArray(value) ? value.join(", ") : value}`;
}

function answerForm(item, fields, status, controls, send) {
  const key = (field) => `field-${item.id}-${fields.indexOf(field)}`;
  const inputs = new Map(); // field name -> [field, control, error line]
  const rows = fields.map((field) => {
    const id = key(field);
    const describedBy = [field.description ? `${id}-help` : null, `${id}-error`].filter(Boolean).join(" ");
    const common = { id, name: field.name, required: field.required, "aria-describedby": describedBy };
    let control;
    if (field.choices) {
      control = h("select", common,
        h("option", { value: "" }, field.required ? "— choose —" : "— not said —"),
        field.choices.map((choice, index) => h("option", { value: String(index) }, choice.label)));
    } else {
      control = h("input", {
        ...common,
        type: "text",
        autocomplete: "off",
        inputmode: NUMBER_KINDS[field.type] ?? null,
        dataset: { kind: field.type ?? "text" },
      });
    }
    const error = h("p", { id: `${id}-error`, class: "field-error", hidden: true });
    inputs.set(field.name, [field, control, error]);
    controls.push(control);
    const label = field.title || field.name;
    return h("div", { class: "form-field", dataset: { field: field.name } },
      h("label", { for: id }, label, field.required ? h("span", { class: "required" }, " (required)") : null),
      field.description ? h("span", { id: `${id}-help`, class: "muted help" }, field.description) : null,
      control,
      error);
  });
  const submit = h("button", { type: "submit", class: "primary" }, "Send answer");
  controls.push(submit);
  const form = h("form", { class: "answer-form", "aria-label": "Your answer" },
    h("p", { class: "muted" }, "Your answer (fields marked required must be filled):"),
    rows,
    submit);

  function clearMarks() {
    for (const [, control, error] of inputs.values()) {
      control.removeAttribute("aria-invalid");
      error.hidden = true;
      error.textContent = "";
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearMarks();
    const content = {};
    const shown = [];
    for (const [field, control] of inputs.values()) {
      const value = formValue(field, control);
      if (value === undefined) continue;
      content[field.name] = value;
      shown.push(formShown(field, value));
    }
    if (!shown.length) {
      status.className = "answer-status bad";
      status.textContent = "Fill in the form first.";
      inputs.values().next().value?.[1].focus();
      return;
    }
    const refused = await send({ text: JSON.stringify(content) }, shown.join(", "));
    if (!(refused instanceof ApiError) || refused.code !== "invalid_answer") return;
    const detail = refused.message.replace(FORM_MISFIT, "");
    // "field 'replicas': ..." or "'region' is a required property": the field it names
    const named = /^field '([^']+)'/.exec(detail)?.[1] ?? /^'([^']+)' is a required property/.exec(detail)?.[1];
    const marked = named === undefined ? null : inputs.get(named.split("/")[0]);
    if (marked) {
      const [, control, error] = marked;
      control.setAttribute("aria-invalid", "true");
      error.textContent = detail;
      error.hidden = false;
      control.focus();
    }
  });
  return form;
}

function inboxCard(item, signal) {
  const status = h("p", { class: "answer-status", role: "status", "aria-live": "polite" });
  const controls = [];
  const expires = Date.parse(item.expires_at);
  const card = h("article", { class: "card inbox-item", dataset: { requestId: item.id }, "aria-labelledby": `q-${item.id}` });

  // Sends one answer; resolves to null once recorded, else to the error (the card already says why).
  async function send(body, shown) {
    for (const c of controls) c.disabled = true;
    status.className = "answer-status";
    status.textContent = "Sending…";
    try {
      const answered = await inboxApi(`/human/requests/${encodeURIComponent(item.id)}/answer`, {
        method: "POST",
        body,
        signal,
      });
      card.dataset.outcome = "recorded";
      status.className = "answer-status ok";
      status.textContent = answered?.already_recorded
        ? `Answer recorded (you had already sent it): ${shown}.`
        : `Answer recorded: ${shown}. The run continues.`;
      return null;
    } catch (error) {
      if (error?.name === "AbortError") return error;
      if (error instanceof ApiError && error.status === 401) {
        inboxFailed(error);
        return error;
      }
      const known = error instanceof ApiError ? REFUSALS[error.code] : null;
      card.dataset.outcome = "refused";
      status.className = "answer-status bad";
      status.textContent = error instanceof ApiError
        ? `${known ?? "Not recorded"}: ${error.message.replace(FORM_MISFIT, "")} (${error.status}).`
        : error instanceof NoAnswer && error.silent
          ? `Not known whether it was recorded: no answer within ${API_TIMEOUT_MS / 1000} s. Refresh: a question ` +
            "still listed was not answered."
          : `Not recorded: the inbox could not be reached (${error?.message || error}). Try again.`;
      // A wrong answer (422) or an unreachable inbox may be corrected; a refusal is final.
      if (!(error instanceof ApiError) || error.status === 422 || error.status >= 500) {
        for (const c of controls) c.disabled = false;
      }
      return error;
    }
  }

  const optionButtons = item.options.map((o) => {
    const button = h("button", { type: "button", class: "option", dataset: { optionId: o.id } }, o.label);
    button.addEventListener("click", () => send({ option_id: o.id }, o.label));
    controls.push(button);
    return h("li", {}, button, o.consequence ? h("span", { class: "muted" }, ` ${o.consequence}`) : null);
  });
  let textForm = null;
  const form = item.allow_free_text && Array.isArray(item.form) && item.form.length ? item.form : null;
  if (form) {
    textForm = answerForm(item, form, status, controls, send);
  } else if (item.allow_free_text) {
    const text = h("input", { id: `text-${item.id}`, name: "text", maxlength: 4000, autocomplete: "off" });
    const submit = h("button", { type: "submit" }, "Send answer");
    controls.push(text, submit);
    textForm = h("form", { class: "answer-text" },
      h("label", { for: `text-${item.id}` }, item.options.length ? "Or answer in your own words" : "Your answer"),
      text, submit);
    textForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const value = text.value.trim();
      if (!value) {
        status.className = "answer-status bad";
        status.textContent = "Write an answer first.";
        text.focus();
        return;
      }
      send({ text: value }, `“${value}”`);
    });
  }
  const link = item.source_link; // the run's source (HUM-5); human-interaction sends only http(s) links
  card.append(...[ // DOM append writes a null as the text "null": the absent parts are left out
    h("p", { class: "muted task" }, uncut(item.title)),
    askedLine(item),
    link && /^https?:\/\//i.test(link.href)
      ? h("p", { class: "source" },
          h("a", { href: link.href, target: "_blank", rel: "noopener noreferrer" }, link.label || link.href))
      : null,
    h("h2", { id: `q-${item.id}`, class: "question" }, item.question),
    reasonLine(item),
    item.context ? h("p", { class: "why" }, h("strong", {}, item.reason ? "Context: " : "Why: "), item.context) : null,
    optionButtons.length ? h("ul", { class: "options", "aria-label": "Options" }, optionButtons) : null,
    textForm,
    h("p", { class: "deadline" },
      h("strong", {}, "Answer by "), h("time", { datetime: item.expires_at }, when(item.expires_at)),
      Number.isNaN(expires) ? ". " : ` (${expires > Date.now() ? `in ${duration((expires - Date.now()) / 1000)}` : "overdue"}). `,
      h("span", { class: "on-timeout" }, atDeadline(item))),
    status,
  ].filter(Boolean));
  return card;
}

// Why the agent asks (OBS-1: ask_human's `reason`, its short phrase) with what kind of help it wants as a label
// (the analytics' names of the kinds, capitalized); nothing when it gave no reason (the context then reads as the
// why, as before).
function reasonLine(item) {
  if (!item.reason) return null;
  const name = item.reason_kind ? String(REASON_KINDS[item.reason_kind] ?? item.reason_kind) : "";
  const kind = name ? name[0].toUpperCase() + name.slice(1) : null;
  return h("p", { class: "reason" },
    kind ? h("span", { class: "reason-kind", dataset: { kind: item.reason_kind } }, kind) : null,
    kind ? " " : null,
    h("strong", {}, "Why: "), item.reason);
}

// Which run asks, and when: two runs asking the same question (two deliveries of one PR) read apart. The run
// links to its timeline for a person whose role may read it (an inbox-only person gets the id as text).
export function shortRunId(runId) {
  const id = String(runId ?? "");
  return id.length > 12 ? `${id.slice(0, 12)}…` : id;
}

function askedLine(item) {
  if (!item.run_id && !item.created_at) return null;
  const asked = Date.parse(item.created_at);
  const run = item.run_id
    ? me?.role
      ? h("a", { href: `#/runs/${encodeURIComponent(item.run_id)}`, title: item.run_id, class: "run-link" }, shortRunId(item.run_id))
      : h("code", { title: item.run_id, class: "run-id" }, shortRunId(item.run_id))
    : null;
  return h("p", { class: "muted asked", dataset: { runId: item.run_id ?? "" } },
    run ? ["Run ", run] : null,
    run && !Number.isNaN(asked) ? " · " : null,
    Number.isNaN(asked) ? null : [h("span", {}, "asked "), h("time", { datetime: item.created_at }, when(item.created_at)),
      ` (${duration((Date.now() - asked) / 1000)} ago)`]);
}

function inboxView(signal) {
  if (!inboxToken() && !signedInPerson()) {
    inboxSignInView();
    return;
  }
  const list = h("div", { id: "inbox", "aria-live": "polite" });
  const who = h("span", { id: "inbox-who", class: "muted" });
  const refresh = h("button", { type: "button" }, "Refresh");
  const leave = h("button", { type: "button" }, "Sign out of the inbox");
  leave.addEventListener("click", () => {
    if (!inboxToken()) return signOut(null); // signed in with the provider: sign out of the console
    sessionStorage.removeItem(INBOX_TOKEN_KEY);
    go("#/inbox", null);
  });
  show(h("div", { class: "toolbar" }, h("h1", {}, "Your questions"), who, refresh, leave), list);
  const cards = new Map(); // request id -> card (an answered card stays until the next sign-in)

  async function load() {
    const data = await inboxApi("/human/inbox", { signal });
    who.textContent = `Signed in to the inbox as ${person(data.user)}`;
    const pending = new Set(data.requests.map((r) => r.id));
    for (const [id, card] of cards) {
      if (!pending.has(id) && !card.dataset.outcome) {
        card.remove();
        cards.delete(id);
      }
    }
    for (const item of [...data.requests].reverse()) { // newest first: prepend oldest to newest
      if (cards.has(item.id)) continue;
      const card = inboxCard(item, signal);
      cards.set(item.id, card);
      list.prepend(card);
    }
    list.querySelector(".empty")?.remove();
    if (!cards.size) list.append(h("p", { class: "empty" }, "No questions are waiting for you."));
  }
  refresh.addEventListener("click", () => load().catch(inboxFailed));
  load().catch(inboxFailed);
  // No live tail for a person (it needs an API token): the inbox re-reads every 10 s while open.
  const timer = setInterval(() => load().catch(inboxFailed), 10_000);
  signal.addEventListener("abort", () => clearInterval(timer));
}

// ------------------------------------------------------------------ routing
async function route() {
  viewFailed = false;
  viewAbort?.abort();
  viewAbort = new AbortController();
  const signal = viewAbort.signal;
  // shown again by the view's tail(); a view without one (sign-in, the wizard, the inbox, which re-reads) has
  // nothing live to speak of
  $("live").hidden = true;
  setLive("off");
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (!token() && !me) { // no API token: perhaps a person signed in with the provider (the session cookie)
    try {
      me = await sessionPerson(signal);
    } catch (error) {
      failed(error);
    }
    if (signal.aborted) return;
  }
  if (parts[0] === "inbox") { // a person's own sign-in, independent of the operator's API token
    renderChrome("inbox");
    const signedIn = Boolean(inboxToken()) || signedInPerson();
    inboxView(signal);
    if (signedIn) $("view").focus({ preventScroll: true }); // the sign-in form focuses its token field
    return;
  }
  if (!token() && !signedInPerson()) {
    renderChrome();
    signInView();
    return;
  }
  if (signedInPerson() && !me.role) { // signed in with no role: their own inbox, nothing else
    location.hash = "#/inbox";
    return;
  }
  if (!me) {
    try {
      me = await api("/whoami", { signal });
    } catch (error) {
      failed(error);
      if (!me) return;
    }
  }
  renderChrome(parts[0] === "wizard" ? "triggers" : parts[0] || "runs");
  if (parts[0] === "signin") location.hash = "#/runs";
  else if (parts[0] === "runs" && parts[1]) runView(signal, parts[1]);
  else if (parts[0] === "waiting") waitingView(signal);
  else if (parts[0] === "wizard") wizardView(signal, parts[1] ?? null);
  else if (parts[0] === "triggers" && parts[1]) deliveriesView(signal, parts[1]);
  else if (parts[0] === "triggers") triggersView(signal);
  else if (parts[0] === "analytics") analyticsView(signal, query);
  else if (parts[0] === "audit") auditView(signal, query);
  else runsView(signal, query);
  // the page's start for the keyboard, unless the view put the focus in itself (the wizard's first field)
  if (!$("view").contains(document.activeElement) || document.activeElement === $("view")) {
    $("view").focus({ preventScroll: true });
  }
}

window.addEventListener("hashchange", () => {
  showPending();
  route();
});
$("sign-out").addEventListener("click", () => signOut(null));
$("journal-state-check").addEventListener("click", () => checkJournal());
setInterval(() => document.hidden || checkJournal(), JOURNAL_CHECK_MS);
document.addEventListener("visibilitychange", () => document.hidden || checkJournal());
route();
checkJournal();
