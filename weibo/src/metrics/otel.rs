//! The job's instruments registered with an OpenTelemetry meter
//! (`Job::with_meter`): observable counters and gauges whose callbacks
//! read the same counters as the Prometheus text (see [`super::prometheus`]),
//! when the meter provider collects. Nothing is recorded per record.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::prometheus::{Family, Kind, Sample};

/// What the instruments read: the job's families now.
pub(crate) type FamilySource = Arc<dyn Fn() -> Vec<Family> + Send + Sync>;

/// The registered instruments, kept as long as the job's handle. The
/// meter provider keeps their callbacks for as long as it lives (the
/// OpenTelemetry API cannot unregister them): dropped, this empties the
/// slot they read, so they report nothing more and hold nothing of the job.
pub(crate) struct Instruments {
    slot: Arc<std::sync::Mutex<Option<FamilySource>>>,
    _kept: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Instruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Instruments({})", self._kept.len())
    }
}

impl Drop for Instruments {
    fn drop(&mut self) {
        *self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

fn attributes(sample: &Sample) -> Vec<KeyValue> {
    sample.attributes.iter().map(|(k, v)| KeyValue::new(*k, v.clone())).collect()
}

/// Registers an observable instrument on `meter` for every family
/// `source` gives (counters of whole units as `u64`, of seconds as `f64`,
/// gauges as `f64`).
pub(crate) fn register(meter: &Meter, source: &FamilySource) -> Instruments {
    let mut kept: Vec<Box<dyn std::any::Any + Send + Sync>> = Vec::new();
    let slot = Arc::new(std::sync::Mutex::new(Some(source.clone())));
    for family in source() {
        let name = family.name;
        let read = slot.clone();
        let samples = move || {
            let source = read.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            source.map(|s| s()).into_iter().flatten().find(|f| f.name == name).map(|f| f.samples).unwrap_or_default()
        };
        // Observes every sample as an `f64` (seconds, gauges).
        let samples = Arc::new(samples);
        let as_f64 = {
            let samples = samples.clone();
            move |o: &dyn opentelemetry::metrics::AsyncInstrument<f64>| {
                for s in samples() {
                    o.observe(s.value, &attributes(&s));
                }
            }
        };
        let (unit, help) = (family.unit, family.help);
        match (family.kind, unit) {
            (Kind::Counter, "s") => kept.push(Box::new(
                meter.f64_observable_counter(name).with_unit(unit).with_description(help).with_callback(as_f64).build(),
            )),
            (Kind::Counter, _) => kept.push(Box::new(
                meter
                    .u64_observable_counter(name)
                    .with_unit(unit)
                    .with_description(help)
                    .with_callback(move |o| {
                        for s in samples() {
                            // Counts, exact below 2^53.
                            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                            o.observe(s.value as u64, &attributes(&s));
                        }
                    })
                    .build(),
            )),
            (Kind::Gauge, _) => kept.push(Box::new(
                meter.f64_observable_gauge(name).with_unit(unit).with_description(help).with_callback(as_f64).build(),
            )),
        }
    }
    Instruments { slot, _kept: kept }
}

/// A meter provider that exports over OTLP (HTTP, protobuf) to `endpoint`
/// every `every`, describing the job as service `job`: what
/// `Job::with_otlp` registers the job's instruments with. Dropping it
/// exports once more (the job's last values) and shuts it down.
#[cfg(feature = "otlp")]
pub(crate) fn otlp_provider(
    job: &str,
    endpoint: &str,
    every: std::time::Duration,
) -> crate::error::Result<opentelemetry_sdk::metrics::SdkMeterProvider> {
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    let refused = |why: &str| crate::error::Error::Connector {
        name: "otlp".into(),
        message: format!("cannot export metrics to `{endpoint}`: {why}"),
        source: None,
    };
    if endpoint.trim().is_empty() {
        return Err(refused("no endpoint given"));
    }
    if every.is_zero() {
        return Err(refused("the export interval is zero"));
    }
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_protocol(Protocol::HttpBinary)
        // Below the 5 s the SDK waits for the last export on shutdown, so
        // that one is not abandoned mid-flight.
        .with_timeout(every.clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(4)))
        .build()
        .map_err(|e| refused(&e.to_string()))?;
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).with_interval(every).build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(job.to_string()).build();
    Ok(opentelemetry_sdk::metrics::SdkMeterProvider::builder().with_reader(reader).with_resource(resource).build())
}
