//! lksadmin node agent.
