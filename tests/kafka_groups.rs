//! Scale-out through Kafka consumer groups against a real broker: offsets
//! left to the tasks' transactions, repartitioning through a topic, and
//! two members splitting the partitions with a survivor taking over.
//!
//! Group members run as children: this test binary itself, started with
//! `WEIBO_KAFKA_CHILD` set, running only the `child` test.

use weibo_tests::kafka_common::*;
use weibo_tests::s3_server;

/// The entry point of this binary's child processes (see `kafka_common::run_child`).
#[test]
fn child() {
    run_child();
}

#[test]
fn a_group_can_leave_its_offsets_to_the_transactions_of_its_tasks() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output, dir) = events_setup("txoffsets");
    let group_name = format!("{output}-group");
    let member = || {
        let (i, o, g, d) = (input.clone(), output.clone(), group_name.clone(), dir.path().to_path_buf());
        let out = output.clone();
        weibo::testing::block_on(async move {
            let newest = |d: &Path| -> Vec<u64> {
                (0..4).map(|p| newest_checkpoint(&d.join(format!("partition-{p}/checkpoints")))).collect()
            };
            let before = newest(&d);
            let group = KafkaGroup::new(bootstrap(), g, [i], d.clone())
                .with_session_timeout(Duration::from_secs(3))
                .offsets_in_transactions()
                .spawn(move |task| {
                    let job = paced_job(&task.id(), task.checkpoint_dir());
                    let source = task.source(Json).until_end().build::<Event>()?;
                    let sink = KafkaSink::new(bootstrap(), &o, Json)
                        .with_transactions(task.id(), task.redo_dir())
                        .with_consumed_offsets(&source);
                    counting(&job, source, sink, 0);
                    Ok(job)
                })
                .unwrap();
            let started = Instant::now();
            // Every task finishes its input with a final checkpoint.
            while committed(&out).0.len() < EVENTS as usize
                || newest(&d).iter().zip(&before).any(|(now, then)| now <= then)
            {
                assert!(started.elapsed() < Duration::from_secs(120), "the group's tasks finished their input");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            group.stop().await.unwrap();
        });
    };
    member();
    assert_exactly_once(&output);
    // The group started again on the same storage: its tasks had finished,
    // so each restores its final checkpoint and writes nothing.
    member();
    assert_exactly_once(&output);
    // Each task's last transaction carried its partition's end.
    let offsets = group_offsets_by_partition(&group_name, &input);
    assert_eq!(offsets.iter().sum::<i64>(), EVENTS as i64, "the group's offsets are the input's ends: {offsets:?}");
}

#[test]
fn input_not_partitioned_by_key_is_repartitioned_through_a_topic_by_two_groups() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, middle, output) = (unique("rep-in"), unique("rep-mid"), unique("rep-out"));
    create_topic(&input, 4);
    create_topic(&middle, 4);
    create_topic(&output, 3);
    // No Kafka key: the events of one key are spread over every partition.
    let values: Vec<Vec<u8>> =
        (0..EVENTS).map(|id| serde_json::to_vec(&Event { key: id % KEYS, id }).unwrap()).collect();
    let records: Vec<In<'_>> =
        values.iter().map(|v| In { key: None, value: v, headers: vec![], timestamp: None }).collect();
    produce(&input, &records);
    let dir = tempfile::tempdir().unwrap();
    let (d, m, o) = (dir.path().to_path_buf(), middle.clone(), output.clone());
    let out = output.clone();
    weibo::testing::block_on(async move {
        // Stage 1: re-key each event by its key into `middle`, exactly once.
        let m1 = m.clone();
        let first = KafkaGroup::new(bootstrap(), format!("{m}-group"), [input], d.join("first"))
            .spawn(move |task| {
                let job = paced_job(&task.id(), task.checkpoint_dir());
                job.source(task.source(Json).build::<Event>()?).map(|r: KafkaRecord<Event>| r.value).sink_exactly_once(
                    KafkaSink::new(bootstrap(), &m1, Json)
                        .with_transactions(task.id(), task.redo_dir())
                        .with_key(|e: &Event| Some(e.key.to_string().into_bytes())),
                );
                Ok(job)
            })
            .unwrap();
        // Stage 2: each key is in one partition of `middle` now: count.
        let second_group = format!("{o}-group");
        let second = KafkaGroup::new(bootstrap(), second_group.clone(), [m], d.join("second"))
            .with_admin("127.0.0.1:0")
            .with_admin_token("group-token")
            .spawn(move |task| {
                let job = paced_job(&task.id(), task.checkpoint_dir());
                let sink = KafkaSink::new(bootstrap(), &o, Json).with_transactions(task.id(), task.redo_dir());
                counting(&job, task.source(Json).build::<Event>()?, sink, 0);
                Ok(job)
            })
            .unwrap();
        let started = Instant::now();
        while committed(&out).0.len() < EVENTS as usize {
            assert!(started.elapsed() < Duration::from_secs(120), "both stages wrote everything");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The second group's one admin API serves every task it runs.
        let addr = second.admin_addr().expect("the group's admin API");
        assert_eq!(weibo_tests::http(addr, "GET", "/api/jobs", None, None).await.0, 401);
        let (status, body) = weibo_tests::http(addr, "GET", "/api/jobs", Some("group-token"), None).await;
        assert_eq!(status, 200, "{body}");
        let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut names: Vec<String> =
            listed["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap().to_string()).collect();
        names.sort();
        let mut owned: Vec<String> = second.owned().iter().map(|p| format!("{second_group}-{p}")).collect();
        owned.sort();
        assert_eq!(names, owned, "{body}");
        let (_, text) = weibo_tests::http(addr, "GET", "/metrics", Some("group-token"), None).await;
        assert_eq!(text.matches("# TYPE weibo_operator_records_in_total counter").count(), 1, "{text}");
        for name in &names {
            let (status, job) =
                weibo_tests::http(addr, "GET", &format!("/jobs/{name}/api/job"), Some("group-token"), None).await;
            assert_eq!(status, 200, "{job}");
            assert!(job.contains(&format!(r#""job":"{name}""#)), "{job}");
            assert!(text.contains(&format!(r#"job="{name}""#)), "{name} in the group's /metrics");
        }
        // The group starts and stops its tasks: not the API.
        let stop = format!("/jobs/{}/api/stop", names[0]);
        let (status, refused) = weibo_tests::http(addr, "POST", &stop, Some("group-token"), None).await;
        assert_eq!(status, 409, "{refused}");
        first.stop().await.unwrap();
        second.stop().await.unwrap();
    });
    let (got, twice) = committed(&output);
    assert!(twice.is_empty(), "events written twice: {:?}", &twice[..twice.len().min(5)]);
    assert_eq!(got.len() as u64, EVENTS, "every event once");
    // Every key's events were counted by one task: its counts run 1..=n.
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for c in got.values() {
        counts.entry(c.key).or_default().push(c.count);
    }
    for (key, mut cs) in counts {
        cs.sort_unstable();
        let n = cs.len() as u64;
        let first: Vec<u64> = cs.iter().take(8).copied().collect();
        assert!(cs.iter().copied().eq(1..=n), "key {key}: counts are not 1..={n}, each once (they start {first:?})");
    }
}

#[test]
fn two_group_members_split_the_partitions_and_a_survivor_takes_over_with_the_state() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (output, dir, spec) = counting_setup("group");
    let task_checkpoint = |p: i32| newest_checkpoint(&dir.path().join(format!("group/partition-{p}/checkpoints")));
    let member = |name: &str| kafka_child(&format!("group|{spec}|{name}")).stderr(Stdio::inherit()).spawn().unwrap();
    // A alone owns all four partitions and checkpoints each task.
    let mut a = member("a");
    wait_for("a to run and checkpoint all four tasks", Duration::from_secs(60), || {
        owners(dir.path(), "a").len() == 4 && (0..4).all(|p| task_checkpoint(p) > 0)
    });
    // B joins: A stops some tasks with a last checkpoint, B restores them.
    let mut b = member("b");
    wait_for("b to take partitions from a", Duration::from_secs(60), || {
        !owners(dir.path(), "b").is_empty() && owners(dir.path(), "a").len() < 4
    });
    let taken = owners(dir.path(), "b");
    let at_handover: Vec<u64> = taken.iter().map(|p| task_checkpoint(*p)).collect();
    wait_for("b to checkpoint its tasks", Duration::from_secs(60), || {
        taken.iter().zip(&at_handover).all(|(p, before)| task_checkpoint(*p) > *before)
    });
    let (done, _) = committed(&output);
    assert!(
        (done.len() as u64) < EVENTS,
        "the input was all processed before b was killed ({} events): the test needs a slower pace",
        done.len()
    );
    // B dies; after the session timeout A owns everything again and goes
    // on from B's checkpoints.
    b.kill().unwrap();
    b.wait().unwrap();
    wait_for("a to take b's partitions back", Duration::from_secs(60), || owners(dir.path(), "a").len() == 4);
    wait_for("every event in the output", Duration::from_secs(180), || {
        assert!(a.try_wait().unwrap().is_none(), "member a ended");
        committed(&output).0.len() as u64 >= EVENTS
    });
    // For monitoring, the group's committed offsets follow the reading.
    let input = spec.split('|').next().unwrap().to_string();
    wait_for("the group's offsets to reach the end of the input", Duration::from_secs(30), || {
        group_offsets(&format!("{output}-group"), &input) >= EVENTS as i64
    });
    a.kill().unwrap();
    a.wait().unwrap();
    eprintln!("b owned {taken:?}, from checkpoints {at_handover:?}");
    assert_exactly_once(&output);
}

#[test]
fn two_group_members_sharing_checkpoints_in_s3_hand_over_with_the_state() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let bucket = s3_server::unique_bucket("group");
    let (output, dir, spec) = counting_setup("group-s3");
    let tasks = {
        let endpoint = s3_server::server().endpoint.clone();
        move |bucket: &str| {
            weibo_connectors::s3::S3Storage::builder(bucket, "tasks")
                .with_endpoint(&endpoint)
                .with_region("us-east-1")
                .with_credentials("test", "testsecret")
                .allow_http()
                .path_style()
                .build()
                .unwrap()
        }
    };
    let storage = tasks(&bucket);
    let task_checkpoint = |p: i32| {
        // A task's job is named `<group>-<partition>`; its checkpoints are
        // under that prefix.
        let task = storage.under(&format!("{output}-group-{p}"));
        weibo::checkpoint::complete_checkpoints_in(&task, "")
            .map_or(0, |c| c.iter().map(|(n, _)| n.get()).max().unwrap_or(0))
    };
    let member = |name: &str| {
        kafka_child(&format!("group|{spec}|{name}|{bucket}"))
            .env("WEIBO_S3_ENDPOINT", &s3_server::server().endpoint)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut a = member("a");
    wait_for("a to run and checkpoint all four tasks into S3", Duration::from_secs(60), || {
        owners(dir.path(), "a").len() == 4 && (0..4).all(|p| task_checkpoint(p) > 0)
    });
    let mut b = member("b");
    wait_for("b to take partitions from a", Duration::from_secs(60), || {
        !owners(dir.path(), "b").is_empty() && owners(dir.path(), "a").len() < 4
    });
    let taken = owners(dir.path(), "b");
    let at_handover: Vec<u64> = taken.iter().map(|p| task_checkpoint(*p)).collect();
    wait_for("b to checkpoint its tasks into S3", Duration::from_secs(60), || {
        taken.iter().zip(&at_handover).all(|(p, before)| task_checkpoint(*p) > *before)
    });
    assert!((committed(&output).0.len() as u64) < EVENTS, "the input was all processed before b was killed");
    // B dies; A takes its partitions back and goes on from B's checkpoints
    // in S3.
    b.kill().unwrap();
    b.wait().unwrap();
    wait_for("a to take b's partitions back", Duration::from_secs(60), || owners(dir.path(), "a").len() == 4);
    wait_for("every event in the output", Duration::from_secs(180), || {
        assert!(a.try_wait().unwrap().is_none(), "member a ended");
        committed(&output).0.len() as u64 >= EVENTS
    });
    a.kill().unwrap();
    a.wait().unwrap();
    eprintln!("b owned {taken:?}, from checkpoints {at_handover:?} in S3");
    assert_exactly_once(&output);
}
