//! `POST /registry/register`: field rules, claim checks, the ownership probe, then the session
//! written to the registry slot and copied into every bucket (reclaiming held ids).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use http::StatusCode;
use pinboard_protocol::registry::{Held, Lease, RegisterAnswer, RegisterRequest};
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

use super::fields::{Scope, check_claim, normalize_name};
use super::probe::{Probe, probe};
use super::{account_of, claim_of};
use super::{drain_secs_left, new_session_id};
use crate::answers::{self, Act, Handled, REGISTER_BODY_LIMIT, unknown_session};
use crate::config::RegistryLimits;
use crate::http::{Request, Response, WorkerAddr, read_json};
use crate::names::valid_namespace;
use crate::node::Core;
use crate::passport::Credential;
use crate::store::scripts::REGISTER;
use crate::store::{Drain, Reclaim, Session, Takeover, WindDown, lua_option, pair_field};

/// Shortest worker secret accepted: it keys every attestation and proves the probe, so it
/// must not be guessable.
const MIN_SECRET: usize = 16;

const SHAPE: &str = "{clientId, secret, namespaces: string[], advertiseUrl, headroom: number, \
draining: boolean, challenge, challengeValue, hostname?, env?, envs?: {ns: env}, \
takeover?: wind_down|deny, epoch?: integer >= 0, instances?: {ns: id[]}, prevSessionId?}";

#[derive(Deserialize)]
struct Outcome {
    conflict: Option<String>,
    #[serde(default)]
    expiry: u64,
    #[serde(default)]
    now: u64,
    #[serde(default, deserialize_with = "lua_option")]
    drain: Option<Drain>,
    #[serde(default, deserialize_with = "lua_option")]
    replaced: Option<String>,
    /// `prevSessionId` when it was this account's and client's session; otherwise nothing
    /// is reclaimed and every held id comes back in `duplicates`.
    #[serde(default, deserialize_with = "lua_option")]
    reclaim: Option<String>,
}

/// `act` names the client, and a failed probe's outcome, for the log line of a refusal.
pub async fn register(
    core: &Core,
    req: &mut Request<'_>,
    credential: &Credential,
    act: &mut Act,
) -> Handled {
    let body: RegisterRequest = read_json(req, REGISTER_BODY_LIMIT, SHAPE).await?;
    act.about = Some(body.client_id.clone());
    let live = core.live();
    let config = live.config();
    let (mut s, registration) = validate(body, config.hostname_aware, &config.registry)?;
    let Registration {
        advertise,
        challenge,
        challenge_value,
        instances,
        prev_session,
        epoch,
    } = registration;
    if let Err(refusal) = check_claim(claim_of(credential)?, &Scope::of(&s, &advertise)) {
        return Ok(refusal);
    }
    s.account = account_of(credential);

    let timeout = Duration::from_millis(config.verify_timeout_ms);
    let why = match probe(
        &advertise,
        &core.shared.tls.workers,
        &s.secret,
        &challenge,
        &challenge_value,
        timeout,
    )
    .await
    {
        Probe::Pass => None,
        Probe::Failed(why) => Some(why),
        Probe::Mismatch => Some("another worker answers there".to_owned()),
    };
    if let Some(why) = why {
        // The detail is the node's log's, not the caller's.
        act.detail = Some(format!("probe of {}: {why}", s.advertise_url));
        return Ok(answers::bad_request("registration probe failed"));
    }

    let hosts_wanted: Vec<(String, &str)> = match &s.hostname {
        Some(h) => s
            .namespaces
            .iter()
            .map(|ns| (format!("{h}{ns}"), s.env_of(ns)))
            .collect(),
        None => Vec::new(),
    };
    let envs_wanted: Vec<(&str, &str)> = match s.takeover {
        Some(t) => s
            .env
            .iter()
            .chain(s.envs.values())
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|env| (env, t.as_str()))
            .collect(),
        None => Vec::new(),
    };
    let record = s.encode();
    let epoch = epoch.to_string();
    let pairs: Vec<String> = s
        .namespaces
        .iter()
        .map(|ns| pair_field(s.env_of(ns), ns))
        .collect();
    let pairs = serde_json::to_string(&pairs).expect("serializes");
    let hosts_wanted = serde_json::to_string(&hosts_wanted).expect("serializes");
    let envs_wanted = serde_json::to_string(&envs_wanted).expect("serializes");
    let store = &core.store;
    let keys = &store.keys;
    let drain = keys.drain(&s.client_id);
    // Every bucket must answer before anything is written: a registration cut short by one
    // that does not would leave this session live in the others, placed on there, while its
    // worker (answered 503) refuses every forward to it as not its session's, and the worker's
    // retry could no longer reclaim the rows this session took from the previous one.
    store.every_bucket_answers().await?;
    let outcome: Outcome = store
        .run(
            &REGISTER,
            &[
                keys.sessions().as_bytes(),
                keys.clients().as_bytes(),
                keys.bind_hosts().as_bytes(),
                keys.bind_envs().as_bytes(),
                keys.bind_quarantine().as_bytes(),
                drain.as_bytes(),
                keys.namespaces().as_bytes(),
            ],
            &[
                s.session_id.as_bytes(),
                s.account.as_bytes(),
                s.client_id.as_bytes(),
                record.as_bytes(),
                store.lease().as_bytes(),
                epoch.as_bytes(),
                hosts_wanted.as_bytes(),
                envs_wanted.as_bytes(),
                prev_session.as_deref().unwrap_or("").as_bytes(),
                pairs.as_bytes(),
            ],
        )
        .await?;
    if let Some(conflict) = outcome.conflict {
        return Ok(answers::conflict(&conflict));
    }
    s.expiry = outcome.expiry;

    let reclaim = Reclaim {
        replaces: outcome.replaced.as_deref(),
        prev_session: outcome.reclaim.as_deref(),
        instances: &instances,
    };
    let buckets = match store
        .put_everywhere(&s, outcome.drain.is_some(), Some(&reclaim))
        .await
    {
        Ok(buckets) => buckets,
        Err(e) => {
            // A bucket lost between that check and these writes: the session goes again from
            // wherever it landed (best effort), so that no placement lands on it.
            if let Err(drop) = store.drop_session(&s.session_id, false).await {
                warn!(session = %s.session_id, error = %drop, "dropping a registration cut short failed");
            }
            return Err(e.into());
        }
    };
    // A concurrent registration of the same client may have replaced this session while its
    // copies were being written; they must not outlive it.
    if store.session(&s.session_id).await?.is_none() {
        store.drop_session(&s.session_id, false).await?;
        return Ok(unknown_session());
    }
    let wind_downs: Vec<WindDown> = (buckets.wind_downs.iter())
        .map(|(ns, id, deadline, moved)| WindDown::new(ns, id, Some(*deadline)).moved(*moved))
        .collect();
    store.push_wind_downs(&s.session_id, &wind_downs).await?;
    info!(session = %s.session_id, client = %s.client_id, url = %s.advertise_url, "worker registered");

    let drain_deadline = outcome
        .drain
        .as_ref()
        .and_then(|d| drain_secs_left(d, outcome.now));
    Ok(Response::json_value(
        StatusCode::OK,
        &RegisterAnswer {
            session_id: s.session_id.clone(),
            lease: Lease {
                expires_in_ms: config.lease_ttl_ms,
                draining: s.draining || outcome.drain.is_some(),
                drain_deadline: drain_deadline.map(Into::into),
            },
            duplicates: buckets
                .duplicates
                .into_iter()
                .map(|(ns, id)| Held { ns, id })
                .collect(),
        },
    ))
}

/// What a registration carries besides the session record.
struct Registration {
    advertise: WorkerAddr,
    challenge: String,
    challenge_value: Value,
    instances: BTreeMap<String, Vec<String>>,
    prev_session: Option<String>,
    epoch: u64,
}

/// Applies the field rules (400s), in single or hostname-aware mode, and the registration
/// bounds of `limits`.
fn validate(
    body: RegisterRequest,
    hostname_aware: bool,
    limits: &RegistryLimits,
) -> Result<(Session, Registration), Response> {
    let expected = || answers::bad_request(&format!("expected {SHAPE}"));
    // Every JSON number reads as an f64.
    let headroom = body.headroom.as_f64().unwrap_or(f64::NAN);
    if body.client_id.is_empty()
        || body.secret.is_empty()
        || body.challenge.is_empty()
        || body.namespaces.is_empty()
        || !headroom.is_finite()
        || headroom < 0.0
    {
        return Err(expected());
    }
    if body.secret.len() < MIN_SECRET {
        return Err(answers::bad_request(&format!(
            "secret must be at least {MIN_SECRET} bytes"
        )));
    }
    // It is sent back to the worker in the probe's `Pinboard-Proxy-Secret` header.
    if !body.secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(answers::bad_request("secret must be visible ASCII"));
    }
    if let Some(ns) = body.namespaces.iter().find(|ns| !valid_namespace(ns)) {
        return Err(answers::bad_request(&format!("invalid namespace: {ns}")));
    }
    let namespaces: Vec<String> = body
        .namespaces
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let max = limits.max_namespaces_per_worker;
    if namespaces.len() > max {
        return Err(answers::bad_request(&format!(
            "too many namespaces: {} (registry.max_namespaces_per_worker is {max})",
            namespaces.len()
        )));
    }
    let registered = |ns: &String| -> Result<(), Response> {
        if namespaces.contains(ns) {
            Ok(())
        } else {
            Err(answers::bad_request(&format!(
                "namespace not registered: {ns}"
            )))
        }
    };
    let advertise = WorkerAddr::parse(&body.advertise_url).map_err(answers::bad_request)?;

    let (hostname, env, envs, takeover) = if hostname_aware {
        let Some(hostname) = &body.hostname else {
            return Err(answers::bad_request(
                "hostname is required in hostname-aware mode",
            ));
        };
        let hostname = normalize_name("hostname", hostname)?;
        let env = match &body.env {
            Some(env) => normalize_name("env", env)?,
            None => hostname.clone(),
        };
        let mut envs = BTreeMap::new();
        for (ns, env) in body.envs.iter().flatten() {
            registered(ns)?;
            envs.insert(ns.clone(), normalize_name("env", env)?);
        }
        let takeover = body.takeover.unwrap_or(Takeover::WindDown);
        (Some(hostname), Some(env), envs, Some(takeover))
    } else {
        for (field, present) in [
            ("hostname", body.hostname.is_some()),
            ("env", body.env.is_some()),
            ("envs", body.envs.is_some()),
            ("takeover", body.takeover.is_some()),
            ("epoch", body.epoch.is_some_and(|e| e != 0)),
        ] {
            if present {
                return Err(answers::bad_request(&format!(
                    "{field} requires hostname-aware mode"
                )));
            }
        }
        (None, None, BTreeMap::new(), None)
    };
    let instances = body.instances.unwrap_or_default();
    let held: usize = instances.values().map(Vec::len).sum();
    let max = limits.max_instances_per_register;
    if held > max {
        return Err(answers::bad_request(&format!(
            "too many instances: {held} (registry.max_instances_per_register is {max})"
        )));
    }
    for ns in instances.keys() {
        registered(ns)?;
    }
    let session = Session {
        session_id: new_session_id(),
        client_id: body.client_id,
        account: String::new(),
        secret: body.secret,
        advertise_url: body.advertise_url.trim_end_matches('/').to_string(),
        namespaces,
        hostname,
        env,
        envs,
        takeover,
        headroom,
        draining: body.draining,
        degraded_since: None,
        expiry: 0,
    };
    Ok((
        session,
        Registration {
            advertise,
            challenge: body.challenge,
            challenge_value: body.challenge_value,
            instances,
            prev_session: body.prev_session_id,
            epoch: body.epoch.unwrap_or(0),
        },
    ))
}
