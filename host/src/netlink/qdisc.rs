//! Root qdiscs: `fq` on a pod's `eth0` for EDT egress shaping.
use futures::{StreamExt, TryStreamExt};
use rtnetlink::{
    packet_core::{
        DefaultNla, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE,
        NLM_F_REQUEST,
    },
    packet_route::{
        tc::{TcAttribute, TcHandle, TcMessage, TcOption},
        RouteNetlinkMessage,
    },
};

use super::{errno, nl_err, Netlink};
use crate::Error;

/// The kind of the qdisc that releases EDT-stamped packets on time.
pub const FQ: &str = "fq";
const TCA_FQ_PLIMIT: u16 = 1;
const TCA_FQ_FLOW_PLIMIT: u16 = 2;

impl Netlink {
    /// Makes `fq` the root qdisc of link `index` (`tc qdisc replace dev X root
    /// fq limit L flow_limit L`, `L` = `limit` packets). `Ok(false)` when the
    /// kernel has no `sch_fq` (built without it, module not loadable: "unknown
    /// qdisc kind").
    pub async fn replace_root_fq(&self, index: u32, limit: u32) -> Result<bool, Error> {
        let op = || format!("make fq the root qdisc of link #{index}");
        let idx = i32::try_from(index).map_err(|e| Error::netlink(op(), e))?;
        let mut msg = TcMessage::with_index(idx);
        msg.header.parent = TcHandle::ROOT;
        msg.attributes.push(TcAttribute::Kind(FQ.to_string()));
        // TCA_FQ_PLIMIT and TCA_FQ_FLOW_PLIMIT (linux/pkt_sched.h).
        let limit = limit.to_ne_bytes().to_vec();
        msg.attributes.push(TcAttribute::Options(vec![
            TcOption::Other(DefaultNla::new(TCA_FQ_PLIMIT, limit.clone())),
            TcOption::Other(DefaultNla::new(TCA_FQ_FLOW_PLIMIT, limit)),
        ]));
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
        let mut handle = self.handle.clone();
        let mut responses = handle.request(req).map_err(|e| nl_err(op(), e))?;
        while let Some(m) = responses.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                if e.code.is_none() {
                    continue;
                }
                let e = rtnetlink::Error::NetlinkError(e);
                // sch_fq missing: the kernel cannot find the kind (ENOENT), or
                // refuses it (EOPNOTSUPP).
                if matches!(errno(&e), Some(libc::ENOENT | libc::EOPNOTSUPP)) {
                    return Ok(false);
                }
                return Err(nl_err(op(), e));
            }
        }
        Ok(true)
    }

    /// The kind of link `index`'s root qdisc (`noqueue`, `fq`, ...), if any.
    pub async fn root_qdisc(&self, index: u32) -> Result<Option<String>, Error> {
        let idx = i32::try_from(index).map_err(|e| Error::netlink("list qdiscs", e))?;
        let mut s = self.handle.qdisc().get().index(idx).execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err(format!("list the qdiscs of link #{index}"), e))?
        {
            if m.header.index != idx || m.header.parent != TcHandle::ROOT {
                continue;
            }
            for a in &m.attributes {
                if let TcAttribute::Kind(k) = a {
                    return Ok(Some(k.clone()));
                }
            }
        }
        Ok(None)
    }
}
