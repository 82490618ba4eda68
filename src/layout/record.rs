//! Writing a family's layout record and its writer: the compare-and-set that keeps the
//! largest copy count ever recorded, and the log line naming whose record is replaced.

use super::{LayoutStores, Liveness};
use crate::error::Result;
use crate::family::Family;
use crate::store::{Layout, LayoutStore, LayoutSwap, LayoutWriter};

/// How often [`record_configured`] retries its compare-and-set after another instance changed
/// the record in between.
const RECORD_ATTEMPTS: u32 = 8;

/// Records `family`'s configured copy count with a compare-and-set, keeping the largest copy
/// count ever recorded (never lowering `max_copies`, whatever another instance wrote meanwhile),
/// and this instance as the record's writer. A record of another copy count is replaced (the
/// newest start records the layout being rolled out), and the replacement is logged naming the
/// instance and release that wrote it and whether that instance is still registered. Returns
/// the recorded `max_copies` and the record's writer.
pub(super) async fn record_configured(
    stores: &LayoutStores,
    family: &Family,
    liveness: &Liveness,
) -> Result<(u32, Option<LayoutWriter>)> {
    let name = family.name();
    let mut recorded = stores.layouts.read_layout(name).await?;
    for _ in 0..RECORD_ATTEMPTS {
        let max_copies = recorded.map_or(family.copies, |layout| {
            layout.max_copies.max(layout.copies).max(family.copies)
        });
        if let Some(recorded) = recorded {
            if recorded.copies != family.copies {
                report_replaced(stores, family, recorded, max_copies).await;
            }
        }
        let layout = Layout {
            copies: family.copies,
            max_copies,
        };
        if recorded == Some(layout) {
            let writer = stores.layouts.read_layout_writer(name).await.unwrap_or_else(|err| {
                tracing::debug!(family = name, error = %err, "cannot read the layout record's writer");
                None
            });
            return Ok((max_copies, writer));
        }
        match stores.layouts.write_layout(name, recorded, layout).await? {
            LayoutSwap::Applied => {
                return Ok((
                    max_copies,
                    record_writer(&*stores.layouts, name, liveness, family.copies).await,
                ))
            }
            // Another instance changed the record in between: decide again from what it wrote.
            LayoutSwap::Changed(current) => recorded = current,
        }
    }
    Err(crate::error::Error::new(
        crate::error::ErrorKind::Unavailable,
        format!("the layout record of family {name:?} kept changing: {RECORD_ATTEMPTS} compare-and-set attempts failed"),
    ))
}

/// Logs that this instance replaces `family`'s record of `recorded` copies, naming who wrote it
/// and whether that instance still runs (is registered).
async fn report_replaced(
    stores: &LayoutStores,
    family: &Family,
    recorded: Layout,
    max_copies: u32,
) {
    let name = family.name();
    let writer = stores.layouts.read_layout_writer(name).await.ok().flatten();
    let running = match &writer {
        Some(writer) => stores
            .fleet
            .instances()
            .await
            .ok()
            .map(|instances| instances.iter().any(|record| record.id == writer.instance)),
        None => None,
    };
    tracing::warn!(
        family = name,
        configured = family.copies,
        recorded = recorded.copies,
        max_copies,
        writer = writer.as_ref().map_or("unknown", |writer| writer.instance.as_str()),
        writer_release = writer.as_ref().map_or("unknown", |writer| writer.release.as_str()),
        writer_running = ?running,
        "family layout changed: recording the configured copy count over another instance's"
    );
}

/// Records this instance as the writer of `family`'s record of `copies`; a failure is logged
/// (the record itself is written). Returns the writer recorded.
pub(super) async fn record_writer(
    store: &dyn LayoutStore,
    family: &str,
    liveness: &Liveness,
    copies: u32,
) -> Option<LayoutWriter> {
    let writer = liveness.writer(copies);
    match store.write_layout_writer(family, &writer).await {
        Ok(()) => Some(writer),
        Err(err) => {
            tracing::warn!(family, error = %err, "cannot record this instance as the layout record's writer");
            None
        }
    }
}
