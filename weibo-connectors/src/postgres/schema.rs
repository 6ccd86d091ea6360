//! The table, checked against the mapping before any row is written, and
//! the SQL the sink runs on it.

use tokio_postgres::types::Type;

use super::write::{Attempt, Kind, kind, message};
use super::{Inner, Rejected, quote};

/// What the check found, and the SQL that follows from it.
pub(crate) struct Checked {
    /// Each mapped column's Postgres type, in mapping order.
    pub(crate) types: Vec<Type>,
    /// The mapped columns with the target's types, for a table the rows
    /// go through (no constraints: Postgres checks those in the target).
    pub(crate) rows_ddl: String,
    /// The target, quoted.
    pub(crate) target: String,
    /// `INSERT INTO <target> (<columns>)`.
    insert: String,
    /// The mapped columns, quoted and joined.
    pub(crate) columns: String,
    /// The upsert key, quoted and joined (empty: append).
    keys: String,
    /// `ON CONFLICT …` (empty: append).
    conflict: String,
}

impl Checked {
    /// Whether the sink appends (or upserts).
    pub(crate) fn is_append(&self) -> bool {
        self.keys.is_empty()
    }

    /// Merges the rows of `rows` (a table of the mapped columns and their
    /// order, `weibo_seq`; only the row `weibo_seq = $1` when `one`) into
    /// the target: appended, or upserted with the last row of each key
    /// winning.
    pub(crate) fn merge_sql(&self, rows: &str, one: bool) -> String {
        let only = if one { " WHERE weibo_seq = $1" } else { "" };
        if self.keys.is_empty() {
            format!("{} SELECT {} FROM {rows}{only}", self.insert, self.columns)
        } else {
            format!(
                "{} SELECT DISTINCT ON ({keys}) {} FROM {rows}{only} ORDER BY {keys}, weibo_seq DESC {}",
                self.insert,
                self.columns,
                self.conflict,
                keys = self.keys
            )
        }
    }
}

/// One column of the table.
struct Attribute {
    name: String,
    sql_type: String,
    not_null: bool,
    has_default: bool,
    identity: bool,
    generated: bool,
}

/// Checks the table against the mapping, and creates the sink's own
/// tables (progress, dead letters) where missing.
pub(crate) async fn check<T>(inner: &Inner<T>) -> weibo::Result<Checked> {
    super::write::retrying!(inner, "check the table", |_attempt| { check_once(inner).await })
}

async fn check_once<T>(inner: &Inner<T>) -> Result<Checked, Attempt> {
    let client = inner.connect().await?;
    let sql = |e| inner.attempt("check the table", e);
    let table = inner.table.sql();
    let found: Option<String> = client
        .query_opt(
            "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
            &[&table],
        )
        .await
        .map_err(sql)?
        .map(|r| r.get(0));
    let Some(schema) = found else {
        let db: String = client.query_one("SELECT current_database()::text", &[]).await.map_err(sql)?.get(0);
        return Err(Attempt::Fail(inner.err(format!("table `{}` does not exist in database `{db}`", inner.table))));
    };
    // The sink's own tables go beside the target, wherever the search
    // path found it.
    let _ = inner.schema.set(schema);
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef, \
             a.attidentity <> '', a.attgenerated <> '' FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table],
        )
        .await
        .map_err(sql)?;
    let attributes: Vec<Attribute> = rows
        .iter()
        .map(|r| Attribute {
            name: r.get(0),
            sql_type: r.get(1),
            not_null: r.get(2),
            has_default: r.get(3),
            identity: r.get(4),
            generated: r.get(5),
        })
        .collect();
    let listing = || attributes.iter().map(|a| format!("{} {}", a.name, a.sql_type)).collect::<Vec<_>>().join(", ");
    let mut mapped = Vec::new();
    for c in &inner.columns {
        let Some(a) = attributes.iter().find(|a| a.name == c.name) else {
            return Err(Attempt::Fail(inner.err(format!(
                "table `{}` has no column `{}` (mapped from `{}`); its columns: {}",
                inner.table,
                c.name,
                c.rust_type,
                listing()
            ))));
        };
        if a.generated {
            return Err(Attempt::Fail(inner.err(format!(
                "column `{}.{}` is generated: Postgres computes it, the sink cannot write it",
                inner.table, c.name
            ))));
        }
        if inner.keys.iter().any(|&k| inner.columns.get(k).is_some_and(|kc| kc.name == c.name)) && !a.not_null {
            return Err(Attempt::Fail(inner.err(format!(
                "upsert key column `{}.{}` may be NULL: a unique index lets any number of NULL keys in, so which \
                 row a NULL key updates is not defined (make the column NOT NULL)",
                inner.table, c.name
            ))));
        }
        mapped.push(a);
    }
    for a in &attributes {
        if a.not_null
            && !a.has_default
            && !a.identity
            && !a.generated
            && !inner.columns.iter().any(|c| c.name == a.name)
        {
            return Err(Attempt::Fail(inner.err(format!(
                "column `{}.{}` ({}) is NOT NULL without a default, and the mapping does not write it",
                inner.table, a.name, a.sql_type
            ))));
        }
    }
    let columns = inner.columns.iter().map(|c| quote(&c.name)).collect::<Vec<_>>().join(", ");
    let probe = client.prepare(&format!("SELECT {columns} FROM {table} LIMIT 0")).await.map_err(sql)?;
    let mut types = Vec::new();
    for ((c, a), col) in inner.columns.iter().zip(&mapped).zip(probe.columns()) {
        let ty = col.type_().clone();
        if !(c.accepts)(&ty) {
            return Err(Attempt::Fail(inner.err(format!(
                "column `{}.{}` is `{}` in Postgres, and the mapping gives `{}`, which cannot be written to it",
                inner.table, c.name, a.sql_type, c.rust_type
            ))));
        }
        types.push(ty);
    }
    let rows_ddl = inner
        .columns
        .iter()
        .zip(&mapped)
        .map(|(c, a)| format!("{} {}", quote(&c.name), a.sql_type))
        .collect::<Vec<_>>()
        .join(", ");
    let keys = inner.keys.iter().filter_map(|&i| inner.columns.get(i)).map(|c| quote(&c.name)).collect::<Vec<_>>();
    let updates: Vec<String> = inner
        .columns
        .iter()
        .enumerate()
        .filter(|(i, _)| !inner.keys.contains(i))
        .map(|(_, c)| format!("{q} = EXCLUDED.{q}", q = quote(&c.name)))
        .collect();
    let conflict = match (keys.is_empty(), updates.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!("ON CONFLICT ({}) DO NOTHING", keys.join(", ")),
        (false, false) => format!("ON CONFLICT ({}) DO UPDATE SET {}", keys.join(", "), updates.join(", ")),
    };
    let checked = Checked {
        types,
        rows_ddl,
        target: table.clone(),
        insert: format!("INSERT INTO {table} ({columns})"),
        columns,
        keys: keys.join(", "),
        conflict,
    };
    // The merge, planned against an empty stage: an upsert key without a
    // unique index on exactly its columns fails here (the planner picks
    // the arbiter index), not at the first commit.
    let probe = format!(
        "BEGIN; CREATE TEMP TABLE weibo_probe ({}, weibo_seq int8) ON COMMIT DROP; EXPLAIN {}; ROLLBACK",
        checked.rows_ddl,
        checked.merge_sql("weibo_probe", false)
    );
    if let Err(e) = client.batch_execute(&probe).await {
        let _ = client.batch_execute("ROLLBACK").await;
        if kind(&e) == Kind::Passing {
            return Err(sql(e));
        }
        let hint = if checked.keys.is_empty() {
            String::new()
        } else {
            format!(" (an upsert on ({}) needs a unique index or constraint on exactly these columns)", checked.keys)
        };
        return Err(Attempt::Fail(inner.err_caused(format!("cannot write into table `{}`{hint}", inner.table), e)));
    }
    create(
        inner,
        &client,
        &format!(
            "CREATE TABLE IF NOT EXISTS {} (sink text NOT NULL, instance int4 NOT NULL, run text NOT NULL, \
             epoch int8 NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, instance, run, epoch))",
            inner.qualify(super::txn::PROGRESS)
        ),
    )
    .await?;
    let spool = inner.qualify(super::txn::SPOOL);
    create(
        inner,
        &client,
        &format!(
            "CREATE TABLE IF NOT EXISTS {spool} (sink text NOT NULL, instance int4 NOT NULL, run text NOT NULL, \
             epoch int8 NOT NULL, chunk int4 NOT NULL, body bytea NOT NULL, origins bytea NOT NULL, refused text, \
             sources text[] NOT NULL, \
             PRIMARY KEY (sink, instance, run, epoch, chunk))"
        ),
    )
    .await?;
    // Chunks compress well (rows of one table side by side): LZ4 where the
    // server has it (PostgreSQL 14 and later, built with it), which halves
    // what the spool writes for a little of the server's time. Set once:
    // the ALTER locks the spool every job shares.
    let compression: Option<String> = client
        .query_opt(
            "SELECT attcompression::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'body'",
            &[&spool],
        )
        .await
        .map_err(sql)?
        .and_then(|r| r.try_get(0).ok());
    if compression.as_deref() != Some("l") {
        let alter = format!(
            "SET lock_timeout = '2s'; ALTER TABLE {spool} ALTER COLUMN body SET COMPRESSION lz4; RESET lock_timeout"
        );
        if let Err(e) = client.batch_execute(&alter).await {
            let _ = client.batch_execute("RESET lock_timeout").await;
            tracing::info!(sink = %inner.name, error = %message(&e), "spooled chunks stay compressed with pglz");
        }
    }
    if inner.store_positions {
        create(
            inner,
            &client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (sink text NOT NULL, source text NOT NULL, key text NOT NULL, \
                 partition int4 NOT NULL, partition_name text, position int8 NOT NULL, \
                 committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, source, key))",
                inner.qualify(super::txn::POSITIONS)
            ),
        )
        .await?;
    }
    if let Rejected::DeadLetterTable(dead) = &inner.rejected {
        create(
            inner,
            &client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (sink text NOT NULL, instance int4 NOT NULL, epoch int8 NOT NULL, \
                 source text NOT NULL, partition int8 NOT NULL, \"offset\" int8 NOT NULL, row text, error text NOT NULL, \
                 rejected_at timestamptz NOT NULL DEFAULT now())",
                inner.qualify(dead)
            ),
        )
        .await?;
    }
    Ok(checked)
}

/// Runs a `CREATE … IF NOT EXISTS`; another job creating the same table at
/// the same moment makes Postgres report a duplicate, which is fine.
async fn create<T>(inner: &Inner<T>, client: &tokio_postgres::Client, ddl: &str) -> Result<(), Attempt> {
    match client.batch_execute(ddl).await {
        Ok(()) => Ok(()),
        Err(e) if e.code().is_some_and(|c| c.code() == "23505" || c.code() == "42P07") => Ok(()),
        Err(e) => Err(inner.attempt("create the sink's tables", e)),
    }
}
