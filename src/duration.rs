//! Serde support for humantime durations in config files (`"250ms"`, `"2s"`, `"10m"`), and
//! [`millis`], a duration as the whole milliseconds Redis commands take.
//!
//! Every subsystem's config uses it through `#[serde(with = "crate::duration")]`, or
//! `crate::duration::option` for an optional field; a duration that does not parse names its
//! text and the expected shape.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Deserializes a humantime duration.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|err| {
        serde::de::Error::custom(format!(
            "{text:?} is not a duration ({err}); write it like \"250ms\", \"2s\" or \"10m\""
        ))
    })
}

/// Serializes a duration the way a config file writes it (`"250ms"`, `"1m 30s"`), for
/// `hotsplit config check`.
pub(crate) fn serialize<S: Serializer>(
    duration: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*duration).to_string())
}

/// Serde support for optional humantime durations (a field that is absent is `None`).
pub(crate) mod option {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Deserializes a present humantime duration as `Some`.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(deserializer).map(Some)
    }

    /// Serializes a present duration as [`super::serialize`] does; an absent one is left out.
    pub(crate) fn serialize<S: Serializer>(
        duration: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => super::serialize(duration, serializer),
            None => serializer.serialize_none(),
        }
    }
}
