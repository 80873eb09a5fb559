// k6: the same loads as loadtest/wrk/*.lua, against any Pinboard deployment.
//
//   k6 run -e BASE_URL=https://edge.example.com -e TOKEN=… loadtest/k6/pinboard.js
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e SCENARIO=steady -e VUS=64 -e DURATION=30s loadtest/k6/pinboard.js
//
// Variables (-e NAME=value):
//   BASE_URL   the deployment, with its base path if it has one (default http://127.0.0.1:8080)
//   TOKEN      a data-plane Passport credential, sent as `Authorization: Bearer TOKEN` (optional)
//   SCENARIO   steady | fresh | mixed | all (default all: the three one after another)
//   NS         namespace (default /threads)     IDS     steady-state ids (default 10000)
//   PREFIX     steady id prefix (default s-)    VUS     virtual users (default 64)
//   DURATION   per scenario (default 30s)       RUN     tag making fresh ids unique (default: now)
//
// steady: GET {NS}/{PREFIX}{n}/count over IDS ids; the setup() phase places each once, in
//         order, so the measured part is the steady state.
// fresh:  GET {NS}/f-{RUN}-{vu}-{iter}/count, every request a new placement.
// mixed:  70% steady GET, 20% POST …/echo with a 64 B, 1 KiB or 16 KiB body, 10% fresh GET.
// Every answer must be 200; the thresholds fail the run on more than 0.1% of anything else.

import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';

const BASE = (__ENV.BASE_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const NS = __ENV.NS || '/threads';
const IDS = parseInt(__ENV.IDS || '10000', 10);
const PREFIX = __ENV.PREFIX || 's-';
const VUS = parseInt(__ENV.VUS || '64', 10);
const DURATION = __ENV.DURATION || '30s';
const RUN = __ENV.RUN || String(Date.now());
const SCENARIO = __ENV.SCENARIO || 'all';

const params = {
  headers: __ENV.TOKEN ? { Authorization: `Bearer ${__ENV.TOKEN}` } : {},
};
const postParams = {
  headers: Object.assign({ 'Content-Type': 'application/octet-stream' }, params.headers),
};
const bodies = ['a'.repeat(64), 'b'.repeat(1024), 'c'.repeat(16384)];

function seconds(d) {
  const m = /^(\d+)(ms|s|m|h)$/.exec(d);
  if (!m) return 30;
  const n = parseInt(m[1], 10);
  return { ms: n / 1000, s: n, m: n * 60, h: n * 3600 }[m[2]];
}

const all = {
  steady: { exec: 'steady' },
  fresh: { exec: 'fresh' },
  mixed: { exec: 'mixed' },
};
const chosen = SCENARIO === 'all' ? ['steady', 'fresh', 'mixed'] : [SCENARIO];
const scenarios = {};
chosen.forEach((name, i) => {
  if (!all[name]) throw new Error(`SCENARIO must be steady, fresh, mixed or all, not ${name}`);
  scenarios[name] = Object.assign({
    executor: 'constant-vus',
    vus: VUS,
    duration: DURATION,
    startTime: `${Math.ceil(i * (seconds(DURATION) + 2))}s`,
    tags: { scenario: name },
  }, all[name]);
});

export const options = {
  scenarios,
  // Placing IDS ids in setup() takes a while on a remote deployment.
  setupTimeout: '300s',
  discardResponseBodies: true,
  thresholds: {
    http_req_failed: ['rate<0.001'],
  },
  summaryTrendStats: ['avg', 'med', 'p(99)', 'p(99.9)', 'max'],
};

function steadyUrl(n) {
  return `${BASE}${NS}/${PREFIX}${n}/count`;
}

// Places every steady-state id once, in batches, before anything is measured.
export function setup() {
  if (!chosen.includes('steady') && !chosen.includes('mixed')) return;
  const batch = 100;
  for (let start = 0; start < IDS; start += batch) {
    const reqs = [];
    for (let n = start; n < Math.min(IDS, start + batch); n++) {
      reqs.push(['GET', steadyUrl(n), null, params]);
    }
    http.batch(reqs).forEach((r) => check(r, { 'placed (200)': (res) => res.status === 200 }));
  }
}

function expect200(res) {
  check(res, { 'status 200': (r) => r.status === 200 });
}

export function steady() {
  expect200(http.get(steadyUrl(Math.floor(Math.random() * IDS)), params));
}

export function fresh() {
  const id = `f-${RUN}-${exec.vu.idInTest}-${exec.vu.iterationInScenario}`;
  expect200(http.get(`${BASE}${NS}/${id}/count`, params));
}

export function mixed() {
  const r = Math.random() * 100;
  if (r < 70) {
    steady();
  } else if (r < 90) {
    const n = Math.floor(Math.random() * IDS);
    expect200(http.post(`${BASE}${NS}/${PREFIX}${n}/echo`, bodies[n % 3], postParams));
  } else {
    const id = `m-${RUN}-${exec.vu.idInTest}-${exec.vu.iterationInScenario}`;
    expect200(http.get(`${BASE}${NS}/${id}/count`, params));
  }
}
