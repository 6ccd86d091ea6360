// The control plane's page: its jobs from /api/jobs every two seconds, each
// with its phase, restarts, process, last checkpoint and a link to its own
// dashboard, and buttons to take a savepoint, stop, upgrade from a
// savepoint (the same spec) and start. The token is kept in the tab's
// session, as the job dashboards keep theirs.
'use strict';

const $ = (id) => document.getElementById(id);
let token = null;

function headers(json) {
  const h = { Accept: 'application/json' };
  if (json) h['Content-Type'] = 'application/json';
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

async function act(job, action, body) {
  $('result').textContent = `${action} ${job}…`;
  try {
    const response = await fetch(`api/jobs/${encodeURIComponent(job)}/${action}`, {
      method: 'POST',
      headers: headers(true),
      body: JSON.stringify(body || {}),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    $('result').textContent = action === 'savepoint'
      ? `savepoint of ${job} written to ${answer.path}`
      : `${action} of ${job} asked`;
  } catch (e) {
    $('result').textContent = `${action} of ${job} refused: ${e.message}`;
  }
  poll(false);
}

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function button(label, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  b.dataset.action = label;
  b.addEventListener('click', onClick);
  return b;
}

function row(j) {
  const s = j.status || {};
  const tr = document.createElement('tr');
  tr.dataset.job = j.name;
  tr.dataset.phase = s.phase;
  const live = j.live || {};
  const checkpoint = live.last_checkpoint == null ? '–' : String(live.last_checkpoint);
  const link = document.createElement('td');
  if (j.spec && j.spec.admin) {
    const a = document.createElement('a');
    a.href = j.spec.admin.replace(/\/$/, '') + '/dashboard';
    a.textContent = 'dashboard';
    link.append(a);
  }
  const actions = document.createElement('td');
  const stamp = () => new Date().toISOString().replace(/[^0-9]/g, '').slice(0, 14);
  if (s.phase === 'running') {
    if (j.spec && j.spec.admin) {
      actions.append(button('savepoint', () => act(j.name, 'savepoint', { name: `ui-${stamp()}` })));
      actions.append(button('upgrade', () => act(j.name, 'upgrade', { savepoint: `upgrade-${stamp()}` })));
    }
    actions.append(button('stop', () => act(j.name, 'stop', {})));
  } else if (s.phase !== 'starting' && s.phase !== 'stopping' && s.phase !== 'restarting') {
    actions.append(button('start', () => act(j.name, 'start', {})));
  }
  tr.append(
    cell(j.name, 'name'),
    cell(s.phase, 'phase'),
    cell(s.reason || ''),
    cell(String(s.restarts || 0), 'n restarts'),
    cell(s.pid == null ? '–' : String(s.pid), 'n'),
    cell(checkpoint, 'n checkpoint'),
    cell(s.last_exit || '–'),
    link,
    actions,
  );
  return tr;
}

let timer = null;

async function poll(again = true) {
  if (again && timer) clearTimeout(timer);
  try {
    const response = await fetch('api/jobs?live=1', { headers: headers(false), cache: 'no-store' });
    if (response.status === 401) {
      $('login').hidden = false;
      return;
    }
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    document.querySelector('#jobs tbody').replaceChildren(...body.jobs.map(row));
    $('updated').textContent = new Date().toLocaleTimeString();
    $('error').hidden = true;
  } catch (e) {
    $('error').textContent = 'The control plane did not answer: ' + e.message;
    $('error').hidden = false;
  }
  if (again) timer = setTimeout(poll, 2000);
}

const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get('token')) {
  token = fragment.get('token');
  sessionStorage.setItem('weibo-token', token);
  history.replaceState(null, '', location.pathname + location.search);
} else {
  token = sessionStorage.getItem('weibo-token');
}
$('login-form').addEventListener('submit', (event) => {
  event.preventDefault();
  token = $('login-token').value.trim();
  sessionStorage.setItem('weibo-token', token);
  $('login').hidden = true;
  poll();
});
poll();
