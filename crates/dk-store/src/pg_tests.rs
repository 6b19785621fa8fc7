//! Tests of the PostgreSQL store against a real server (dk-testkit's, one
//! per test binary, a fresh database per test): the conformance suite,
//! migrations, one chain for several stores appending at once, keyed
//! chains, tampering, and a server that is down and comes back.
//!
//! Without PostgreSQL installed each test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set.

use std::sync::Arc;
use std::time::Duration;

use dk_testkit::postgres::PgServer;

use super::conformance::{self, Subject, event, paired, pairing};
use super::*;

/// The server this binary's tests share, or `None` when skipped.
fn server(test: &str) -> Option<&'static PgServer> {
    PgServer::shared(test)
}

/// A store on a fresh database of the shared server, which it can be
/// reopened from.
fn fresh(server: &'static PgServer) -> Subject {
    let url = server.database();
    let store = PgStore::connect(&url).unwrap();
    Subject {
        name: "postgres",
        store: Box::new(store),
        reopen: Some(Box::new(move || Box::new(PgStore::connect(&url).unwrap()))),
        keep: None,
    }
}

#[test]
fn conformance_postgres() {
    let Some(server) = server("conformance_postgres") else {
        return;
    };
    conformance::run_all(&|| fresh(server));
}

#[test]
fn stores_on_one_database_append_one_unbroken_chain() {
    let Some(server) = server("stores_on_one_database_append_one_unbroken_chain") else {
        return;
    };
    const STORES: usize = 3;
    const THREADS: usize = 4;
    const APPENDS: u64 = 40;
    let url = server.database();
    let stores: Vec<Arc<PgStore>> = (0..STORES)
        .map(|_| Arc::new(PgStore::connect(&url).unwrap()))
        .collect();
    std::thread::scope(|scope| {
        for (s, store) in stores.iter().enumerate() {
            for t in 0..THREADS {
                scope.spawn(move || {
                    for n in 0..APPENDS {
                        // Every other append is a batch of three.
                        let count = if n % 2 == 0 { 1 } else { 3 };
                        let batch: Vec<AuditEvent> = (0..count)
                            .map(|i| {
                                event("decision", (s * 1_000_000 + t * 1_000) as u64 + n * 10 + i)
                            })
                            .collect();
                        store.append_audit(&batch).unwrap();
                    }
                });
            }
            // Changes of state interleave with the decisions.
            let store = store.clone();
            scope.spawn(move || {
                for n in 0..10 {
                    let stored = pairing(&format!("s{s}-d{n}"), &["a"], n + 1);
                    store.put_pairing(&stored, &paired(&stored, n)).unwrap();
                }
            });
        }
    });
    let per_thread = APPENDS / 2 + APPENDS / 2 * 3;
    let expected = (STORES * THREADS) as u64 * per_thread + STORES as u64 * 10;
    for store in &stores {
        let report = store.verify_audit().unwrap();
        assert!(report.is_intact(), "{:?}", report.problems);
        assert_eq!(report.entries, expected);
        assert_eq!(store.load().unwrap().audit_entries, expected);
    }
}

#[test]
fn two_stores_starting_at_once_migrate_once() {
    let Some(server) = server("two_stores_starting_at_once_migrate_once") else {
        return;
    };
    let url = server.database();
    let stores: Vec<PgStore> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| PgStore::connect(&url)))
            .collect();
        starting
            .into_iter()
            .map(|started| started.join().unwrap().unwrap())
            .collect()
    });
    for store in &stores {
        assert_eq!(store.load().unwrap().audit_entries, 0);
    }
    // A newer schema is refused, and says so.
    stores[0]
        .execute_raw("UPDATE dk_schema SET version = 99")
        .unwrap();
    let error = PgStore::connect(&url).unwrap_err();
    assert_eq!(
        error,
        StoreError::NewerSchema {
            found: 99,
            supported: PG_SCHEMA_VERSION
        }
    );
    assert!(error.to_string().contains("use a newer dk"), "{error}");
}

#[test]
fn a_database_of_something_else_is_refused() {
    let Some(server) = server("a_database_of_something_else_is_refused") else {
        return;
    };
    let url = server.database();
    let store = PgStore::connect(&url).unwrap();
    store
        .execute_raw("DROP TABLE dk_schema; CREATE TABLE invoices (id INTEGER);")
        .unwrap();
    drop(store);
    let error = PgStore::connect(&url).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
}

#[test]
fn the_audit_table_refuses_edits_and_tampering_is_found() {
    let Some(server) = server("the_audit_table_refuses_edits_and_tampering_is_found") else {
        return;
    };
    let url = server.database();
    let store = PgStore::connect(&url).unwrap();
    let events: Vec<AuditEvent> = (1..=5).map(|n| event("decision", n)).collect();
    store.append_audit(&events).unwrap();
    for attack in [
        "UPDATE audit SET kind = 'x' WHERE seq = 2",
        "DELETE FROM audit WHERE seq = 2",
        "TRUNCATE audit",
    ] {
        let error = store.execute_raw(attack).unwrap_err();
        assert!(
            error.to_string().contains("append-only"),
            "{attack}: {error}"
        );
    }
    // An owner of the database can still edit it: verification finds it.
    store
        .execute_raw(
            "ALTER TABLE audit DISABLE TRIGGER USER;
             UPDATE audit SET entry = '{\"n\":99}' WHERE seq = 3;",
        )
        .unwrap();
    let report = store.verify_audit().unwrap();
    assert_eq!(
        report
            .problems
            .iter()
            .map(|p| (p.seq, p.what))
            .collect::<Vec<_>>(),
        [(3, ProblemKind::Edited)]
    );
}

#[test]
fn verification_reads_the_log_a_page_at_a_time_and_finds_what_is_wrong_in_any() {
    let Some(server) =
        server("verification_reads_the_log_a_page_at_a_time_and_finds_what_is_wrong_in_any")
    else {
        return;
    };
    let url = server.database();
    let mut store = PgStore::connect(&url).unwrap();
    // Pages of 16 entries: the log below is read in 13 of them.
    store.set_page_bytes(1);
    for batch in 0..10u64 {
        let events: Vec<AuditEvent> = (1..=20)
            .map(|n| event("decision", batch * 20 + n))
            .collect();
        store.append_audit(&events).unwrap();
    }
    let stored = pairing("desk-lamp", &["read_light"], 1);
    store.put_pairing(&stored, &paired(&stored, 1)).unwrap();
    let report = store.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(report.entries, 201);
    assert_eq!(report.head, store.audit_head().unwrap().hash);
    // Edited deep in the log, in a later page than the first: found, and
    // named, by the second reading.
    store
        .execute_raw(
            "ALTER TABLE audit DISABLE TRIGGER USER;
             UPDATE audit SET entry = '{\"n\":9999}' WHERE seq = 150;",
        )
        .unwrap();
    let report = store.verify_audit().unwrap();
    assert_eq!(
        report
            .problems
            .iter()
            .map(|p| (p.seq, p.what))
            .collect::<Vec<_>>(),
        [(150, ProblemKind::Edited)]
    );
    assert_eq!(report.entries, 201);
}

/// The tables of the database at `url`, by name.
fn tables(store: &PgStore) -> Vec<String> {
    store
        .query_raw(
            "SELECT tablename FROM pg_catalog.pg_tables
             WHERE schemaname = current_schema() ORDER BY tablename",
        )
        .unwrap()
}

#[test]
fn a_store_opened_read_only_migrates_nothing_and_writes_nothing() {
    let Some(server) = server("a_store_opened_read_only_migrates_nothing_and_writes_nothing")
    else {
        return;
    };
    // A database without a store: refused, and still empty.
    let url = server.database();
    let error = PgStore::connect_read_only(&url, PgOptions::default()).unwrap_err();
    assert!(error.to_string().contains("holds no dk store"), "{error}");
    // Nothing was made: a second look finds no store either.
    let again = PgStore::connect_read_only(&url, PgOptions::default()).unwrap_err();
    assert_eq!(again.to_string(), error.to_string());
    // A store of an older schema (version 2, before the agents' buckets):
    // read and verified as it is.
    let store = PgStore::connect(&url).unwrap();
    store.append_audit(&[event("decision", 1)]).unwrap();
    store
        .execute_raw("DROP TABLE agent_bucket; UPDATE dk_schema SET version = 2;")
        .unwrap();
    let reader = PgStore::connect_read_only(&url, PgOptions::default()).unwrap();
    let report = reader.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(reader.read_audit(0, 10).unwrap().len(), 1);
    assert_eq!(reader.audit_head().unwrap().seq, 1);
    // Nothing it is asked to write is written.
    assert!(reader.append_audit(&[event("decision", 2)]).is_err());
    assert!(reader.probe_write(1).is_err());
    drop(reader);
    assert_eq!(
        store
            .query_raw("SELECT version::text FROM dk_schema")
            .unwrap(),
        ["2"]
    );
    assert!(!tables(&store).contains(&"agent_bucket".to_owned()));
    assert_eq!(store.audit_head().unwrap().seq, 1);
}

#[test]
fn a_keyed_chain_is_kept_by_every_store_with_its_key() {
    let Some(server) = server("a_keyed_chain_is_kept_by_every_store_with_its_key") else {
        return;
    };
    let url = server.database();
    let plain = PgStore::connect(&url).unwrap();
    plain.append_audit(&[event("decision", 1)]).unwrap();
    let key = AuditKey::generate();
    let with_key = || PgOptions {
        key: Some(key.clone()),
        ..PgOptions::default()
    };
    let keyed = PgStore::connect_with(&url, with_key()).unwrap();
    let second = PgStore::connect_with(&url, with_key()).unwrap();
    keyed.append_audit(&[event("decision", 2)]).unwrap();
    second.append_audit(&[event("decision", 3)]).unwrap();
    let entries = keyed.read_audit(0, 10).unwrap();
    assert_eq!(
        entries.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["decision", "audit-keyed", "decision", "decision"],
        "the chain is keyed once"
    );
    let report = keyed.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    // Without the key: read, not appended to, and the keyed part unchecked.
    assert_eq!(
        plain.append_audit(&[event("decision", 4)]),
        Err(StoreError::KeyRequired { from: 2 })
    );
    assert!(matches!(
        PgStore::connect(&url).unwrap().load(),
        Err(StoreError::KeyRequired { from: 2 })
    ));
    assert!(!plain.verify_audit_with(None, None).unwrap().is_intact());
    let other = PgOptions {
        key: Some(AuditKey::generate()),
        ..PgOptions::default()
    };
    assert!(matches!(
        PgStore::connect_with(&url, other),
        Err(StoreError::WrongKey { .. })
    ));
}

#[test]
fn the_store_works_from_inside_a_runtime() {
    let Some(server) = server("the_store_works_from_inside_a_runtime") else {
        return;
    };
    let store = Arc::new(PgStore::connect(&server.database()).unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inside = store.clone();
    runtime.block_on(async move {
        inside.append_audit(&[event("decision", 1)]).unwrap();
        assert_eq!(inside.audit_head().unwrap().seq, 1);
    });
    assert!(store.verify_audit().unwrap().is_intact());
}

#[test]
fn a_server_that_is_not_there_is_an_error_in_time_without_the_password() {
    if server("a_server_that_is_not_there_is_an_error_in_time_without_the_password").is_none() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://dk:s3cret-pw@127.0.0.1:{port}/nowhere");
    let options = PgOptions {
        timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    // The connection is refused or times out: an error, not a wait.
    let error = PgStore::connect_with(&url, options).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, StoreError::Open { .. }), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(
        text.contains(&format!("postgres://dk@127.0.0.1:{port}/nowhere")),
        "{text}"
    );
    assert!(PgStore::connect("not a url ://").is_err());
}

#[test]
fn a_server_that_goes_away_fails_calls_and_they_work_again_once_it_is_back() {
    let Some(server) =
        PgServer::start("a_server_that_goes_away_fails_calls_and_they_work_again_once_it_is_back")
    else {
        return;
    };
    let options = PgOptions {
        timeout: Duration::from_secs(3),
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&server.database(), options).unwrap();
    store.append_audit(&[event("decision", 1)]).unwrap();
    server.stop();
    // An error within the options' timeout, not a wait for the server.
    let error = store.append_audit(&[event("decision", 2)]).unwrap_err();
    assert!(matches!(error, StoreError::Database(_)), "{error}");
    assert!(store.probe_write(1).is_err());
    server.restart();
    dk_testkit::eventually_blocking("the store writing again", || {
        store.append_audit(&[event("decision", 3)]).is_ok()
    });
    let report = store.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(report.entries, 2, "the failed append left nothing");
}

/// Three stores on one fresh database of `server`, as three vessels of a
/// fleet hold them.
fn three_stores(server: &'static PgServer) -> Vec<PgStore> {
    let url = server.database();
    (0..3).map(|_| PgStore::connect(&url).unwrap()).collect()
}

/// Thirty threads at once, the `i`-th calling `each(i, store)` on
/// `stores[i % 3]`: what each got, in order.
fn at_once<T: Send>(stores: &[PgStore], each: impl Fn(usize, &PgStore) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let running: Vec<_> = (0..30)
            .map(|i| {
                let each = &each;
                let store = &stores[i % stores.len()];
                scope.spawn(move || each(i, store))
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn a_limit_claimed_by_several_stores_at_once_lets_exactly_its_calls_through() {
    let Some(server) =
        server("a_limit_claimed_by_several_stores_at_once_lets_exactly_its_calls_through")
    else {
        return;
    };
    let stores = three_stores(server);
    let now = epoch_ms(std::time::SystemTime::now());
    let hit = |agent: &str| RateHit {
        rule: "three-reads".to_owned(),
        agent: agent.to_owned(),
        at_ms: now,
        calls: 3,
        window_ms: 3_600_000,
    };
    let claims = at_once(&stores, |_, store| {
        store.claim_rate_hit(&hit("helper")).unwrap()
    });
    let counted = claims.iter().filter(|c| **c == RateClaim::Counted).count();
    assert_eq!(counted, 3, "{claims:?}");
    for claim in &claims {
        if let RateClaim::Reached { retry_after_ms } = claim {
            assert!(
                (3_599_000..=3_600_000).contains(retry_after_ms),
                "{claim:?}"
            );
        }
    }
    // Another agent's count is its own; every store reads the three back.
    assert_eq!(
        stores[1].claim_rate_hit(&hit("other")).unwrap(),
        RateClaim::Counted
    );
    let kept = stores[2].load_rate_hits(now).unwrap();
    assert_eq!(kept.iter().filter(|h| h.agent == "helper").count(), 3);
}

#[test]
fn an_agents_rate_taken_by_several_stores_at_once_lets_exactly_its_burst_through() {
    let Some(server) =
        server("an_agents_rate_taken_by_several_stores_at_once_lets_exactly_its_burst_through")
    else {
        return;
    };
    let stores = three_stores(server);
    let now = epoch_ms(std::time::SystemTime::now());
    let takes = |device: &str| {
        vec![
            BucketTake {
                key: "helper".to_owned(),
                calls_per_minute: 1,
                burst: 3,
            },
            BucketTake {
                key: format!("helper\n{device}"),
                calls_per_minute: 1,
                burst: 2,
            },
        ]
    };
    let taken = at_once(&stores, |i, store| {
        let device = if i % 2 == 0 { "lamp" } else { "lock" };
        store.take_from_buckets(&takes(device), now).unwrap()
    });
    // Three calls in all (the agent's burst), at most two to one device.
    assert_eq!(taken.iter().filter(|t| t.is_none()).count(), 3, "{taken:?}");
    for refused in taken.iter().flatten() {
        assert!(refused.1 > 0 && refused.1 <= 60_000, "{refused:?}");
    }
    // A minute later the agent's bucket has room for one more.
    let later = stores[0]
        .take_from_buckets(&takes("fan"), now + 60_000)
        .unwrap();
    assert_eq!(later, None);
}
