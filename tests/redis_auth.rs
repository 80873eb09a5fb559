//! The node on a Redis that wants a login, real redis-server and the real binary: an ACL user
//! (`redis://user:password@`), the `default` user's password (`redis://:password@`), a cluster
//! whose every node wants it; a login refused at start (exit 2, one line, the password masked)
//! and while running (503 + `Retry-After`, never 500, until it is put right).

mod support;

use support::cluster::{cluster_cli, logged_in_on_every_master, warm_node};
use support::fleet::Fixture;
use support::http::get;
use support::node::{Node, refused_at_start, serve_until_exit};
use support::redis::{ADMIN_PASSWORD, RedisCluster, RedisServer, escape};

/// The node's user.
const USER: &str = "pinboard";
/// A password with what a URL must escape (`@`, `:`, `/`, `%`, `#`, `?`): the node is given it
/// percent-encoded.
const PASSWORD: &str = "p@ss:w/rd%#?-0123";

#[test]
fn an_acl_user_registers_and_forwards() {
    let f = Fixture::on(RedisServer::start_acl(USER, PASSWORD), &[]);
    f.serves("acl");
    // Every connection of the node (one per core at least) is logged in as the user: the only
    // `default` one (what a connection is before AUTH) is this redis-cli's.
    f.redis.assert_logged_in_as(USER, 2);
    assert!(!f.node.log().contains(PASSWORD));
}

#[test]
fn the_password_only_form_then_requirepass_changed_live() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    assert!(redis.url().starts_with("redis://:p%40ss%3Aw%2Frd%25"));
    let mut f = Fixture::on(redis, &[]);
    let (worker, session) = f.serves("requirepass");

    // Changed under the node: its connections stay logged in until they are dropped, and then
    // every reconnect is refused.
    f.redis.set_requirepass("changed-under-the-node");
    f.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    f.unavailable_until_fixed(&worker, &session);
    f.node.logs("WRONGPASS");

    f.redis.set_requirepass(PASSWORD);
    f.node.wait_until_ready();
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    assert!(!f.node.log().contains(PASSWORD));
}

#[test]
fn an_acl_user_changed_live_is_unavailable_not_an_error() {
    let f = Fixture::on(RedisServer::start_acl(USER, PASSWORD), &[]);
    let (worker, session) = f.serves("acl-live");

    // Its permissions taken away on the live connections: every command answers NOPERM.
    f.cli(&["ACL", "SETUSER", USER, "-@all"]);
    f.unavailable_until_fixed(&worker, &session);
    f.cli(&["ACL", "SETUSER", USER, "+@all"]);
    f.node.wait_until_ready();

    // Its password changed and its connections dropped: every reconnect is refused.
    f.cli(&["ACL", "SETUSER", USER, "resetpass", ">another-password"]);
    f.cli(&["CLIENT", "KILL", "USER", USER]);
    f.unavailable_until_fixed(&worker, &session);
    f.node.logs("WRONGPASS");

    f.cli(&["ACL", "SETUSER", USER, "resetpass", &format!(">{PASSWORD}")]);
    f.node.wait_until_ready();
    assert_eq!(get(f.node.addr, "/threads/a1/x", None).status, 200);
    let log = f.node.log();
    assert!(!log.contains(PASSWORD) && !log.contains(&escape(PASSWORD)));
}

#[test]
fn a_refused_login_at_start_exits_2_with_one_line() {
    let acl = RedisServer::start_acl(USER, PASSWORD);
    let port = acl.port();
    let wrong = "Wrong-Secret-Password";
    for (url, reason) in [
        (
            format!("redis://{USER}:{wrong}@127.0.0.1:{port}"),
            "WRONGPASS",
        ),
        (format!("redis://:{wrong}@127.0.0.1:{port}"), "WRONGPASS"),
        (
            format!("redis-cluster://{USER}:{wrong}@127.0.0.1:{port}"),
            "WRONGPASS",
        ),
        (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
        // The right login, a database Redis does not have.
        (format!("{}/99", acl.url()), "DB index"),
    ] {
        refused_at_start(&url, &[], reason, &[wrong, PASSWORD, &escape(PASSWORD)]);
    }
    let (_, stderr) = serve_until_exit(&format!("redis://{USER}:{wrong}@127.0.0.1:{port}"), &[]);
    assert!(
        stderr.contains(&format!("redis://{USER}:***@127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn a_cluster_with_a_login_on_every_node() {
    let cluster = RedisCluster::start_acl(USER, PASSWORD);
    let (node, _worker) = warm_node(&cluster, "300000", &[], "cluster-acl");
    // The buckets are spread over the three masters: each one found through CLUSTER SLOTS, and
    // each logged in to, also again once its connections are dropped.
    logged_in_on_every_master(&cluster, &node, USER);

    // The password-only form on the same cluster: the `default` user's password.
    let admin = cluster.url().replacen(
        &format!("{USER}:{}", escape(PASSWORD)),
        &format!(":{ADMIN_PASSWORD}"),
        1,
    );
    assert!(admin.starts_with("redis-cluster://:admin"), "{admin}");
    let other = Node::start(&admin, &[("PINBOARD_SHARDS", "16")]);
    assert_eq!(
        cluster_cli(&cluster, &["EXISTS", support::keys(16).fleet()]),
        "1"
    );
    assert_eq!(get(other.addr, "/threads/id-1/x", None).status, 200);
    assert!(!node.log().contains(PASSWORD) && !other.log().contains(ADMIN_PASSWORD));
}
