//! tc filters: which BPF programs are attached to a device's clsact hooks.
use futures::TryStreamExt;
use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};

use super::{errno, nl_err, Netlink};
use crate::Error;

/// A `cls_bpf` filter: its program's name and kernel id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpfFilter {
    pub prog_name: String,
    pub prog_id: u32,
}

impl Netlink {
    /// The `cls_bpf` filters on the ingress (`true`) or egress hook of link `index`
    /// (`tc filter show dev X ingress|egress`). No clsact qdisc: none.
    pub async fn bpf_filters(&self, index: u32, ingress: bool) -> Result<Vec<BpfFilter>, Error> {
        let idx = i32::try_from(index).map_err(|e| Error::netlink("list filters", e))?;
        let req = self.handle.traffic_filter(idx).get();
        let req = if ingress { req.ingress() } else { req.egress() };
        let mut s = req.execute();
        let mut out = Vec::new();
        loop {
            let m = match s.try_next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) if matches!(errno(&e), Some(libc::EINVAL | libc::ENOENT)) => break,
                Err(e) => return Err(nl_err(format!("list tc filters of link #{index}"), e)),
            };
            for a in &m.attributes {
                if let TcAttribute::Options(opts) = a {
                    let mut f = BpfFilter {
                        prog_name: String::new(),
                        prog_id: 0,
                    };
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.prog_name.clone_from(n);
                            }
                            TcOption::Bpf(TcFilterBpfOption::ProgId(i)) => f.prog_id = *i,
                            _ => {}
                        }
                    }
                    if f.prog_id != 0 {
                        out.push(f);
                    }
                }
            }
        }
        Ok(out)
    }
}
