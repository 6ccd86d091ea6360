// The page of a group of jobs (a KafkaGroup's tasks): lists them, each with
// a link to its dashboard, from /api/jobs every two seconds. The token is
// kept as the job dashboards keep it (same origin, same session).
'use strict';

const $ = (id) => document.getElementById(id);
let token = null;

function seconds(ms) {
  return ms < 60000 ? (ms / 1000).toFixed(0) + ' s' : Math.floor(ms / 60000) + ' min';
}

async function poll() {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = 'Bearer ' + token;
  try {
    const response = await fetch('api/jobs', { headers, cache: 'no-store' });
    if (response.status === 401) {
      $('login').hidden = false;
      return;
    }
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    $('group-name').textContent = body.group;
    document.title = `${body.group} · Weibo`;
    const rows = body.jobs.map((j) => {
      const row = document.createElement('tr');
      row.dataset.job = j.job;
      const name = document.createElement('td');
      name.className = 'name';
      name.textContent = j.job;
      const state = document.createElement('td');
      state.textContent = j.status.state;
      const up = document.createElement('td');
      up.className = 'n';
      up.textContent = seconds(j.uptime_ms);
      const link = document.createElement('td');
      const a = document.createElement('a');
      a.href = `jobs/${encodeURIComponent(j.job)}/dashboard`;
      a.textContent = 'dashboard';
      link.append(a);
      row.append(name, state, up, link);
      return row;
    });
    document.querySelector('#jobs tbody').replaceChildren(...rows);
    $('updated').textContent = new Date().toLocaleTimeString();
    $('error').hidden = true;
  } catch (e) {
    $('error').textContent = 'The admin API did not answer: ' + e.message;
    $('error').hidden = false;
  }
  setTimeout(poll, 2000);
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
