//! A dynamic value as a PostgreSQL parameter: written as the column's
//! type asks, when the value fits it.

use std::error::Error;

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::value::Value;

/// A field of a record, for a column of any of the types below.
#[derive(Clone)]
pub struct SqlValue(pub Value);

impl std::fmt::Debug for SqlValue {
    /// As JSON (how a refused row names its values).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.to_json())
    }
}

type Failure = Box<dyn Error + Sync + Send>;

fn wrong(value: &Value, ty: &Type) -> Failure {
    format!("{} ({}) does not fit a column of type {ty}", value, value.type_name()).into()
}

impl ToSql for SqlValue {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Failure> {
        let v = &self.0;
        match (v, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Bool(b), &Type::BOOL) => b.to_sql(ty, out),
            (Value::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (Value::Int(i), &Type::INT4) => i32::try_from(*i).map_err(|_| wrong(v, ty))?.to_sql(ty, out),
            (Value::Int(i), &Type::INT2) => i16::try_from(*i).map_err(|_| wrong(v, ty))?.to_sql(ty, out),
            (Value::Int(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (Value::Float(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (Value::Float(f), &Type::FLOAT4) => (*f as f32).to_sql(ty, out),
            (Value::Int(i), &Type::FLOAT4) => (*i as f32).to_sql(ty, out),
            (Value::Str(s), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME) => s.as_str().to_sql(ty, out),
            (_, &Type::JSON | &Type::JSONB) => v.to_json().to_sql(ty, out),
            (_, &Type::TEXT | &Type::VARCHAR) => v.to_string().to_sql(ty, out),
            _ => Err(wrong(v, ty)),
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::BOOL
                | Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::JSON
                | Type::JSONB
        )
    }

    to_sql_checked!();
}
