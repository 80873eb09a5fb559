// Prometheus text as the Charts page reads it: samples parsed out of `/metrics`, counter rates
// and histogram quantiles between two scrapes (the arithmetic `rate()` and
// `histogram_quantile()` do). Pure: no DOM, no network.

// Every sample of the text: {name, labels: {…}, value}.
export function parse(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) {
      continue;
    }
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) {
      continue;
    }
    const labels = {};
    const text = match[3] || "";
    const pair = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let found;
    while ((found = pair.exec(text)) !== null) {
      labels[found[1]] = found[2].replace(/\\n/g, "\n").replace(/\\"/g, '"').replace(/\\\\/g, "\\");
    }
    const value = match[4] === "+Inf" ? Infinity : Number(match[4]);
    samples.push({ name: match[1], labels, value });
  }
  return samples;
}

function matches(labels, want) {
  return Object.entries(want).every(([name, value]) => labels[name] === value);
}

// The sum of the samples named `name` whose labels include `want`.
export function sum(samples, name, want = {}) {
  return samples
    .filter((s) => s.name === name && matches(s.labels, want))
    .reduce((total, s) => total + s.value, 0);
}

// Per second between two scrapes, `seconds` apart; a counter that went down (a restart) gives
// the later value over the interval, as Prometheus does.
export function rate(before, after, seconds) {
  if (!(seconds > 0)) {
    return null;
  }
  const delta = after >= before ? after - before : after;
  return delta / seconds;
}

// The cumulative buckets of histogram `name` (samples `name_bucket`) with labels `want`,
// summed over other labels: [[le, count]] sorted by `le`.
export function buckets(samples, name, want = {}) {
  const byLe = new Map();
  for (const s of samples) {
    if (s.name === `${name}_bucket` && matches(s.labels, want)) {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      byLe.set(le, (byLe.get(le) || 0) + s.value);
    }
  }
  return [...byLe.entries()].sort((a, b) => a[0] - b[0]);
}

// The `q` quantile of the observations made between two scrapes' buckets, interpolated
// linearly within the bucket it falls in; `null` when nothing was observed.
export function quantile(q, before, after) {
  const earlier = new Map(before);
  const counts = after.map(([le, n]) => [le, n - (earlier.get(le) || 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (!(total > 0)) {
    return null;
  }
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, n] of counts) {
    if (n >= rank) {
      if (le === Infinity) {
        return lower;
      }
      const inBucket = n - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le;
    below = n;
  }
  return lower;
}
