//! Reading an Avro datum written with one schema into another.
//!
//! The writer's schema and the reader's are matched against each other
//! once, when the pair is first met, into a plan ([`Plan`]); each datum is
//! then read straight from its bytes by that plan. Every decision is made
//! from the two schemas, never from the shape of a decoded value:
//!
//! * a record's fields are matched by the reader field's name or one of its
//!   aliases; writer fields the reader lacks are read and dropped, reader
//!   fields the writer lacks take their default (and a reader field with
//!   neither a writer field nor a default makes the pair unresolvable);
//! * a branch of a writer's union goes to the reader's branch of the same
//!   full name, then of a name the reader lists among its aliases, then of
//!   the same unqualified name; an unnamed type goes to the branch of its
//!   own type, then to the first it promotes into;
//! * an enum symbol the reader lacks takes the reader's default symbol;
//! * the promotions are Avro's: int to long, float or double; long to float
//!   or double; float to double; string to bytes and back.
//!
//! A pair that can never be read fails when the plan is built. A writer
//! branch, or an enum symbol, the reader cannot hold fails only the datums
//! that use it, as the Avro specification asks.
//!
//! The reader is strict about the bytes: a datum that ends early, a
//! collection that declares more items than its bytes can hold, an invalid
//! boolean or UTF-8 string, or a union index out of range is malformed,
//! and the allocation for a declared length never exceeds the bytes left.

use std::collections::HashMap;

use apache_avro::schema::{Alias, InnerDecimalSchema, Name, RecordSchema, UnionSchema, UuidSchema};
use apache_avro::types::Value;
use apache_avro::{Decimal, Schema};
use serde_json::Value as Json;

type NodeId = usize;

/// How deep a datum may nest (recursive schemas); deeper is refused rather
/// than followed until the stack runs out.
const MAX_DEPTH: usize = 512;

/// How many items of a type that takes no bytes (null, an empty record) a
/// collection block may declare.
const MAX_EMPTY_ITEMS: i64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prim {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
}

/// What a primitive becomes in the reader's type.
#[derive(Debug)]
enum Conv {
    Same,
    ToLong,
    ToFloat,
    ToDouble,
    ToString,
    ToBytes,
    /// Into a logical type (date, timestamps, decimal, uuid...), through
    /// Avro's own conversion of a primitive value.
    Logical(Schema),
}

#[derive(Debug)]
enum Step {
    /// The writer's field fills the reader's field at this position.
    Into(usize, NodeId),
    /// A writer field the reader does not have: read and dropped.
    Skip(NodeId),
}

#[derive(Debug)]
enum Node {
    Prim(Prim, Conv),
    Fixed(usize, Option<Schema>),
    /// Per writer symbol: the reader's symbol, or why there is none.
    Enum(Vec<Result<(u32, String), String>>),
    Array(NodeId),
    Map(NodeId),
    Record {
        steps: Vec<Step>,
        names: Vec<String>,
        /// Reader fields the writer does not write, with their defaults.
        defaults: Vec<(usize, Value)>,
    },
    /// A union in the writer: its branch index picks the node.
    Branches(Vec<NodeId>),
    /// The reader's union takes the value in this branch.
    Into(u32, NodeId),
    /// A writer branch no reader type holds.
    Refuse(String),
    /// A record whose plan is being built (a recursive schema).
    Pending,
}

/// The plan for reading one writer schema's datums into one reader schema.
#[derive(Debug)]
pub(crate) struct Plan {
    nodes: Vec<Node>,
    root: NodeId,
}

impl Plan {
    /// Matches `writer` (whose named types may be defined in `named`, the
    /// schemas it references) against `reader`, or against itself when the
    /// reader is `None`.
    pub(crate) fn new(
        writer: &Schema,
        named: &[Schema],
        reader: Option<&Schema>,
    ) -> Result<Plan, String> {
        let mut writer_names = HashMap::new();
        for s in named.iter().chain([writer]) {
            collect_names(s, &mut writer_names);
        }
        let reader_names = match reader {
            Some(r) => {
                let mut names = HashMap::new();
                collect_names(r, &mut names);
                Some(names)
            }
            None => None,
        };
        let mut builder = Builder {
            writer_names: &writer_names,
            reader_names: reader_names.as_ref().unwrap_or(&writer_names),
            nodes: Vec::new(),
            memo: HashMap::new(),
        };
        let root = builder.node(writer, reader.unwrap_or(writer), false)?;
        Ok(Plan {
            nodes: builder.nodes,
            root,
        })
    }

    /// Reads one datum from the whole of `payload`.
    pub(crate) fn read(&self, payload: &[u8]) -> Result<Value, String> {
        let mut input = Input { rest: payload };
        let value = self.value(self.root, &mut input, 0)?;
        if !input.rest.is_empty() {
            return Err(format!(
                "{} byte(s) left after the datum: the payload was not written with this schema",
                input.rest.len()
            ));
        }
        Ok(value)
    }

    // The reading is split in small functions so that each level of a
    // nested datum costs the stack little: a deep datum meets the depth
    // limit, not the end of the stack.
    fn value(&self, id: NodeId, input: &mut Input<'_>, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("the datum nests deeper than {MAX_DEPTH} levels"));
        }
        match &self.nodes[id] {
            Node::Record {
                steps,
                names,
                defaults,
            } => self.record(steps, names, defaults, input, depth),
            Node::Branches(branches) => {
                let i = input.index(branches.len(), "union branch")?;
                self.value(branches[i], input, depth + 1)
            }
            Node::Into(index, node) => Ok(Value::Union(
                *index,
                Box::new(self.value(*node, input, depth + 1)?),
            )),
            Node::Array(items) => self.array(*items, input, depth),
            Node::Map(values) => self.map(*values, input, depth),
            node => leaf(node, input),
        }
    }

    #[inline(never)]
    fn record(
        &self,
        steps: &[Step],
        names: &[String],
        defaults: &[(usize, Value)],
        input: &mut Input<'_>,
        depth: usize,
    ) -> Result<Value, String> {
        // Every reader field is either written or defaulted (the plan
        // refuses a pair where one is neither), so each slot is filled.
        let mut fields: Vec<(String, Value)> =
            names.iter().map(|n| (n.clone(), Value::Null)).collect();
        for step in steps {
            match step {
                Step::Into(at, node) => fields[*at].1 = self.value(*node, input, depth + 1)?,
                Step::Skip(node) => {
                    self.value(*node, input, depth + 1)?;
                }
            }
        }
        for (at, default) in defaults {
            fields[*at].1 = default.clone();
        }
        Ok(Value::Record(fields))
    }

    #[inline(never)]
    fn array(&self, items: NodeId, input: &mut Input<'_>, depth: usize) -> Result<Value, String> {
        let mut out = Vec::new();
        while let Some(n) = input.block(self.takes_no_bytes(items, 0))? {
            out.reserve(n);
            for _ in 0..n {
                out.push(self.value(items, input, depth + 1)?);
            }
        }
        Ok(Value::Array(out))
    }

    #[inline(never)]
    fn map(&self, values: NodeId, input: &mut Input<'_>, depth: usize) -> Result<Value, String> {
        let mut out = HashMap::new();
        while let Some(n) = input.block(false)? {
            out.reserve(n);
            for _ in 0..n {
                let key = input.string()?;
                let v = self.value(values, input, depth + 1)?;
                out.insert(key, v);
            }
        }
        Ok(Value::Map(out))
    }

    /// Whether an item of this node can be written in no bytes at all.
    fn takes_no_bytes(&self, id: NodeId, depth: usize) -> bool {
        if depth > 32 {
            return false;
        }
        match &self.nodes[id] {
            Node::Prim(Prim::Null, _) | Node::Fixed(0, _) => true,
            Node::Record { steps, .. } => steps.iter().all(|s| match s {
                Step::Into(_, n) | Step::Skip(n) => self.takes_no_bytes(*n, depth + 1),
            }),
            Node::Into(_, n) => self.takes_no_bytes(*n, depth + 1),
            _ => false,
        }
    }
}

#[inline(never)]
fn leaf(node: &Node, input: &mut Input<'_>) -> Result<Value, String> {
    match node {
        Node::Prim(p, conv) => convert(input.prim(*p)?, conv),
        Node::Fixed(size, logical) => {
            let v = Value::Fixed(*size, input.take(*size)?.to_vec());
            match logical {
                None => Ok(v),
                Some(s) => convert(v, &Conv::Logical(s.clone())),
            }
        }
        Node::Enum(symbols) => {
            let i = input.index(symbols.len(), "enum symbol")?;
            match &symbols[i] {
                Ok((j, symbol)) => Ok(Value::Enum(*j, symbol.clone())),
                Err(why) => Err(why.clone()),
            }
        }
        Node::Refuse(why) => Err(why.clone()),
        _ => Err("a recursive record's plan was never finished".into()),
    }
}

fn convert(v: Value, conv: &Conv) -> Result<Value, String> {
    Ok(match (conv, v) {
        (Conv::Same, v) => v,
        (Conv::ToLong, Value::Int(i)) => Value::Long(i64::from(i)),
        (Conv::ToFloat, Value::Int(i)) => Value::Float(i as f32),
        (Conv::ToFloat, Value::Long(i)) => Value::Float(i as f32),
        (Conv::ToDouble, Value::Int(i)) => Value::Double(f64::from(i)),
        (Conv::ToDouble, Value::Long(i)) => Value::Double(i as f64),
        (Conv::ToDouble, Value::Float(f)) => Value::Double(f64::from(f)),
        (Conv::ToString, Value::Bytes(b)) => Value::String(
            String::from_utf8(b).map_err(|_| "bytes read as a string are not UTF-8".to_owned())?,
        ),
        (Conv::ToBytes, Value::String(s)) => Value::Bytes(s.into_bytes()),
        // A decimal is its unscaled value's bytes, as many as it needs:
        // apache-avro's conversion would refuse fewer bytes than the
        // declared precision could fill, which every writer produces for
        // small values.
        (Conv::Logical(Schema::Decimal(_)), Value::Bytes(b) | Value::Fixed(_, b)) => {
            Value::Decimal(Decimal::from(b))
        }
        (Conv::Logical(schema), v) => v.resolve(schema).map_err(|e| e.to_string())?,
        (conv, v) => return Err(format!("cannot convert {v:?} by {conv:?}")),
    })
}

struct Builder<'a> {
    writer_names: &'a HashMap<String, Schema>,
    reader_names: &'a HashMap<String, Schema>,
    nodes: Vec<Node>,
    /// Records already planned, by writer and reader full name: a
    /// recursive schema refers back to its own plan.
    memo: HashMap<(String, String, bool), NodeId>,
}

impl Builder<'_> {
    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn deref<'s>(names: &'s HashMap<String, Schema>, s: &'s Schema) -> Result<&'s Schema, String> {
        match s {
            Schema::Ref { name } => {
                let full = name.fullname(None);
                names
                    .get(&full)
                    .ok_or_else(|| format!("the schema refers to {full}, which it does not define"))
            }
            s => Ok(s),
        }
    }

    /// The node reading `w` into `r`. `skip` reads a writer field the
    /// reader drops: `r` is then the writer's own schema.
    fn node(&mut self, w: &Schema, r: &Schema, skip: bool) -> Result<NodeId, String> {
        let w = Self::deref(self.writer_names, w)?;
        let r = Self::deref(
            if skip {
                self.writer_names
            } else {
                self.reader_names
            },
            r,
        )?;
        match (w, r) {
            (Schema::Union(wu), _) => {
                let mut branches = Vec::with_capacity(wu.variants().len());
                for b in wu.variants() {
                    let id = match self.node(b, r, skip) {
                        Ok(id) => id,
                        Err(why) => self.push(Node::Refuse(format!(
                            "the writer's union branch {} has no place in the reader's schema: {why}",
                            describe(self.writer_names, b)
                        ))),
                    };
                    branches.push(id);
                }
                Ok(self.push(Node::Branches(branches)))
            }
            (_, Schema::Union(ru)) => {
                let (index, branch) = self.branch(w, ru, skip)?;
                let node = self.node(w, branch, skip)?;
                let index = u32::try_from(index).map_err(|_| "a union too large".to_owned())?;
                Ok(self.push(Node::Into(index, node)))
            }
            (Schema::Record(wr), Schema::Record(rr)) => {
                if !named_alike(&wr.name, &rr.name, rr.aliases.as_ref()) {
                    return Err(format!(
                        "the writer's record {} is not the reader's {}",
                        wr.name.fullname(None),
                        rr.name.fullname(None)
                    ));
                }
                self.record(wr, rr, skip)
            }
            (Schema::Enum(we), Schema::Enum(re)) => {
                if !named_alike(&we.name, &re.name, re.aliases.as_ref()) {
                    return Err(format!(
                        "the writer's enum {} is not the reader's {}",
                        we.name.fullname(None),
                        re.name.fullname(None)
                    ));
                }
                let default = match &re.default {
                    Some(d) => Some(position(&re.symbols, d).ok_or_else(|| {
                        format!("the reader's enum default {d} is not one of its symbols")
                    })?),
                    None => None,
                };
                let symbols = we
                    .symbols
                    .iter()
                    .map(|s| match position(&re.symbols, s).or(default) {
                        Some(j) => Ok((j, re.symbols[j as usize].clone())),
                        None => Err(format!(
                            "the symbol {s} of enum {} is not the reader's, and the reader has no default",
                            re.name.fullname(None)
                        )),
                    })
                    .collect();
                Ok(self.push(Node::Enum(symbols)))
            }
            (Schema::Array(wa), Schema::Array(ra)) => {
                let items = self.node(&wa.items, &ra.items, skip)?;
                Ok(self.push(Node::Array(items)))
            }
            (Schema::Map(wm), Schema::Map(rm)) => {
                let values = self.node(&wm.types, &rm.types, skip)?;
                Ok(self.push(Node::Map(values)))
            }
            _ => self.leaf(w, r),
        }
    }

    fn record(
        &mut self,
        wr: &RecordSchema,
        rr: &RecordSchema,
        skip: bool,
    ) -> Result<NodeId, String> {
        let key = (wr.name.fullname(None), rr.name.fullname(None), skip);
        if let Some(id) = self.memo.get(&key) {
            return Ok(*id);
        }
        let id = self.push(Node::Pending);
        self.memo.insert(key, id);
        let mut steps = Vec::with_capacity(wr.fields.len());
        let mut written = vec![false; rr.fields.len()];
        for wf in &wr.fields {
            let at = rr
                .fields
                .iter()
                .position(|rf| rf.name == wf.name)
                .or_else(|| {
                    rr.fields
                        .iter()
                        .position(|rf| rf.aliases.contains(&wf.name))
                });
            match at {
                Some(at) if !written[at] => {
                    written[at] = true;
                    let node =
                        self.node(&wf.schema, &rr.fields[at].schema, skip)
                            .map_err(|why| {
                                format!("field {} of {}: {why}", wf.name, rr.name.fullname(None))
                            })?;
                    steps.push(Step::Into(at, node));
                }
                _ => {
                    let node = self.node(&wf.schema, &wf.schema, true)?;
                    steps.push(Step::Skip(node));
                }
            }
        }
        let mut defaults = Vec::new();
        for (at, rf) in rr.fields.iter().enumerate() {
            if written[at] {
                continue;
            }
            let default = rf.default.as_ref().ok_or_else(|| {
                format!(
                    "the reader's field {} of {} is not written and has no default",
                    rf.name,
                    rr.name.fullname(None)
                )
            })?;
            let value = default_value(self.reader_names, &rf.schema, default, 0)
                .map_err(|why| format!("the default of field {}: {why}", rf.name))?;
            defaults.push((at, value));
        }
        self.nodes[id] = Node::Record {
            steps,
            names: rr.fields.iter().map(|f| f.name.clone()).collect(),
            defaults,
        };
        Ok(id)
    }

    /// The reader's branch for a writer type that is not a union.
    fn branch<'s>(
        &self,
        w: &Schema,
        ru: &'s UnionSchema,
        skip: bool,
    ) -> Result<(usize, &'s Schema), String> {
        let names = if skip {
            self.writer_names
        } else {
            self.reader_names
        };
        let branches: Vec<(usize, &Schema, &Schema)> = ru
            .variants()
            .iter()
            .enumerate()
            .map(|(i, b)| Ok((i, b, Self::deref(names, b)?)))
            .collect::<Result<_, String>>()?;
        if let Some(wn) = w.name() {
            let kind = std::mem::discriminant(w);
            let alike = |b: &Schema| std::mem::discriminant(b) == kind;
            let found = branches
                .iter()
                .find(|(_, _, b)| alike(b) && b.name() == Some(wn))
                .or_else(|| {
                    branches.iter().find(|(_, _, b)| {
                        alike(b)
                            && b.aliases()
                                .is_some_and(|a| a.iter().any(|a| alias_is(a, wn)))
                    })
                })
                .or_else(|| {
                    branches.iter().find(|(_, _, b)| {
                        alike(b) && b.name().is_some_and(|n| n.name() == wn.name())
                    })
                });
            if let Some((i, b, _)) = found {
                return Ok((*i, b));
            }
        } else if let Some(wp) = base(w) {
            let exact = branches
                .iter()
                .find(|(_, _, b)| b.name().is_none() && base(b) == Some(wp));
            let promoted = || {
                branches.iter().find(|(_, _, b)| {
                    b.name().is_none() && base(b).is_some_and(|bp| promotion(wp, bp).is_some())
                })
            };
            if let Some((i, b, _)) = exact.or_else(promoted) {
                return Ok((*i, b));
            }
        }
        Err(format!(
            "no branch of the reader's union holds the writer's {}",
            describe(self.writer_names, w)
        ))
    }

    /// Primitives, fixed and logical types.
    fn leaf(&mut self, w: &Schema, r: &Schema) -> Result<NodeId, String> {
        let mismatch = || {
            format!(
                "the writer's {} cannot be read as the reader's {}",
                describe(self.writer_names, w),
                describe(self.reader_names, r)
            )
        };
        // The reader's logical type, when it is not the primitive itself.
        let logical = |r: &Schema| (base_schema(r).as_ref() != Some(r)).then(|| r.clone());
        if let (Some(wf), Some(rf)) = (fixed_of(w), fixed_of(r)) {
            if wf.1 != rf.1 || !named_alike(wf.0, rf.0, rf.2) {
                return Err(mismatch());
            }
            if let (Schema::Decimal(wd), Schema::Decimal(rd)) = (w, r)
                && wd.scale != rd.scale
            {
                return Err(format!("{}: the decimals' scales differ", mismatch()));
            }
            return Ok(self.push(Node::Fixed(wf.1, logical(r))));
        }
        let (Some(wp), Some(rp)) = (base(w), base(r)) else {
            return Err(mismatch());
        };
        if let (Schema::Decimal(wd), Schema::Decimal(rd)) = (w, r)
            && wd.scale != rd.scale
        {
            return Err(format!("{}: the decimals' scales differ", mismatch()));
        }
        let conv = if wp == rp {
            match logical(r) {
                Some(l) => Conv::Logical(l),
                None => Conv::Same,
            }
        } else {
            let conv = promotion(wp, rp).ok_or_else(mismatch)?;
            if logical(r).is_some() {
                // A promotion into a logical type (an int read as a
                // timestamp-millis, a string as a decimal) is not Avro's.
                return Err(mismatch());
            }
            conv
        };
        Ok(self.push(Node::Prim(wp, conv)))
    }
}

fn collect_names(s: &Schema, out: &mut HashMap<String, Schema>) {
    match s {
        Schema::Record(r) => {
            out.insert(r.name.fullname(None), s.clone());
            for f in &r.fields {
                collect_names(&f.schema, out);
            }
        }
        Schema::Enum(e) => {
            out.insert(e.name.fullname(None), s.clone());
        }
        Schema::Fixed(f) | Schema::Duration(f) => {
            out.insert(f.name.fullname(None), s.clone());
        }
        Schema::Decimal(d) => {
            if let InnerDecimalSchema::Fixed(f) = &d.inner {
                out.insert(f.name.fullname(None), s.clone());
            }
        }
        Schema::Uuid(UuidSchema::Fixed(f)) => {
            out.insert(f.name.fullname(None), s.clone());
        }
        Schema::Array(a) => collect_names(&a.items, out),
        Schema::Map(m) => collect_names(&m.types, out),
        Schema::Union(u) => {
            for b in u.variants() {
                collect_names(b, out);
            }
        }
        _ => {}
    }
}

/// Whether a writer's named type is the reader's: the same full name, a
/// full name among the reader's aliases, or the same unqualified name.
fn named_alike(w: &Name, r: &Name, aliases: Option<&Vec<Alias>>) -> bool {
    w == r || aliases.is_some_and(|a| a.iter().any(|a| alias_is(a, w))) || w.name() == r.name()
}

fn alias_is(a: &Alias, name: &Name) -> bool {
    a.fullname(None) == name.fullname(None)
}

fn position(symbols: &[String], s: &str) -> Option<u32> {
    symbols
        .iter()
        .position(|x| x == s)
        .and_then(|i| u32::try_from(i).ok())
}

/// A fixed type's name, size and aliases, for fixed and the logical types
/// written as fixed.
fn fixed_of(s: &Schema) -> Option<(&Name, usize, Option<&Vec<Alias>>)> {
    let f = match s {
        Schema::Fixed(f) | Schema::Duration(f) | Schema::Uuid(UuidSchema::Fixed(f)) => f,
        Schema::Decimal(d) => match &d.inner {
            InnerDecimalSchema::Fixed(f) => f,
            InnerDecimalSchema::Bytes => return None,
        },
        _ => return None,
    };
    Some((&f.name, f.size, f.aliases.as_ref()))
}

/// The primitive a type is written as (None for fixed and complex types).
fn base(s: &Schema) -> Option<Prim> {
    Some(match s {
        Schema::Null => Prim::Null,
        Schema::Boolean => Prim::Boolean,
        Schema::Int | Schema::Date | Schema::TimeMillis => Prim::Int,
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => Prim::Long,
        Schema::Float => Prim::Float,
        Schema::Double => Prim::Double,
        Schema::Bytes | Schema::BigDecimal | Schema::Uuid(UuidSchema::Bytes) => Prim::Bytes,
        Schema::Decimal(d) if matches!(d.inner, InnerDecimalSchema::Bytes) => Prim::Bytes,
        Schema::String | Schema::Uuid(UuidSchema::String) => Prim::String,
        _ => return None,
    })
}

fn base_schema(s: &Schema) -> Option<Schema> {
    Some(match base(s)? {
        Prim::Null => Schema::Null,
        Prim::Boolean => Schema::Boolean,
        Prim::Int => Schema::Int,
        Prim::Long => Schema::Long,
        Prim::Float => Schema::Float,
        Prim::Double => Schema::Double,
        Prim::Bytes => Schema::Bytes,
        Prim::String => Schema::String,
    })
}

fn promotion(w: Prim, r: Prim) -> Option<Conv> {
    Some(match (w, r) {
        (Prim::Int, Prim::Long) => Conv::ToLong,
        (Prim::Int | Prim::Long, Prim::Float) => Conv::ToFloat,
        (Prim::Int | Prim::Long | Prim::Float, Prim::Double) => Conv::ToDouble,
        (Prim::Bytes, Prim::String) => Conv::ToString,
        (Prim::String, Prim::Bytes) => Conv::ToBytes,
        _ => return None,
    })
}

fn describe(names: &HashMap<String, Schema>, s: &Schema) -> String {
    let s = Builder::deref(names, s).unwrap_or(s);
    match s.name() {
        Some(n) => format!(
            "{:?} {}",
            apache_avro::schema::SchemaKind::from(s),
            n.fullname(None)
        ),
        None => format!("{:?}", apache_avro::schema::SchemaKind::from(s)).to_lowercase(),
    }
}

/// A field default (JSON, as the schema gives it) as a value of the field's
/// type. A union's default is of its first branch.
fn default_value(
    names: &HashMap<String, Schema>,
    s: &Schema,
    json: &Json,
    depth: usize,
) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("the default nests too deep".into());
    }
    let s = Builder::deref(names, s)?;
    let bad = || format!("{json} is not a {}", describe(names, s));
    let bytes = |j: &Json| -> Result<Vec<u8>, String> {
        // Avro writes bytes and fixed defaults as strings of code points
        // 0-255, one per byte.
        j.as_str()
            .ok_or_else(bad)?
            .chars()
            .map(|c| u8::try_from(u32::from(c)).map_err(|_| bad()))
            .collect()
    };
    Ok(match s {
        Schema::Union(u) => {
            let first = u.variants().first().ok_or_else(bad)?;
            Value::Union(0, Box::new(default_value(names, first, json, depth + 1)?))
        }
        Schema::Record(r) => {
            let obj = json.as_object().ok_or_else(bad)?;
            let mut fields = Vec::with_capacity(r.fields.len());
            for f in &r.fields {
                let v = match obj.get(&f.name).or(f.default.as_ref()) {
                    Some(j) => default_value(names, &f.schema, j, depth + 1)?,
                    None => return Err(format!("{}: field {} is missing", bad(), f.name)),
                };
                fields.push((f.name.clone(), v));
            }
            Value::Record(fields)
        }
        Schema::Enum(e) => {
            let sym = json.as_str().ok_or_else(bad)?;
            Value::Enum(position(&e.symbols, sym).ok_or_else(bad)?, sym.to_owned())
        }
        Schema::Array(a) => Value::Array(
            json.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|j| default_value(names, &a.items, j, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Map(m) => Value::Map(
            json.as_object()
                .ok_or_else(bad)?
                .iter()
                .map(|(k, j)| Ok((k.clone(), default_value(names, &m.types, j, depth + 1)?)))
                .collect::<Result<_, String>>()?,
        ),
        Schema::Null if json.is_null() => Value::Null,
        Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(bad)?),
        Schema::Float => Value::Float(json.as_f64().ok_or_else(bad)? as f32),
        Schema::Double => Value::Double(json.as_f64().ok_or_else(bad)?),
        Schema::String => Value::String(json.as_str().ok_or_else(bad)?.to_owned()),
        Schema::Bytes => Value::Bytes(bytes(json)?),
        _ => {
            let raw = match base(s) {
                Some(Prim::Int) => Value::Int(
                    json.as_i64()
                        .and_then(|i| i32::try_from(i).ok())
                        .ok_or_else(bad)?,
                ),
                Some(Prim::Long) => Value::Long(json.as_i64().ok_or_else(bad)?),
                Some(Prim::Bytes) => Value::Bytes(bytes(json)?),
                Some(Prim::String) => Value::String(json.as_str().ok_or_else(bad)?.to_owned()),
                _ => match fixed_of(s) {
                    Some((_, size, _)) => {
                        let b = bytes(json)?;
                        if b.len() != size {
                            return Err(bad());
                        }
                        Value::Fixed(size, b)
                    }
                    None => return Err(bad()),
                },
            };
            if base_schema(s).as_ref() == Some(s) || matches!(s, Schema::Fixed(_)) {
                raw
            } else {
                raw.resolve(s).map_err(|e| format!("{}: {e}", bad()))?
            }
        }
    })
}

/// The bytes of a datum still to read.
struct Input<'a> {
    rest: &'a [u8],
}

const SHORT: &str =
    "the payload ends before its datum does: it was cut short, or not written with this schema";

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.rest.len() {
            return Err(SHORT.to_owned());
        }
        let (now, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(now)
    }

    fn long(&mut self) -> Result<i64, String> {
        let mut z: u64 = 0;
        for shift in (0..70).step_by(7) {
            let [b] = self.take(1)? else {
                return Err(SHORT.to_owned());
            };
            let b = *b;
            if shift == 63 && b > 1 {
                return Err("a variable-length integer overflows 64 bits".into());
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
        }
        Err("a variable-length integer runs past ten bytes".into())
    }

    fn int(&mut self) -> Result<i32, String> {
        let l = self.long()?;
        i32::try_from(l).map_err(|_| format!("{l} does not fit an int"))
    }

    fn length(&mut self) -> Result<usize, String> {
        let l = self.long()?;
        let n = usize::try_from(l).map_err(|_| format!("a negative length {l}"))?;
        if n > self.rest.len() {
            return Err(SHORT.to_owned());
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.length()?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
    }

    fn index(&mut self, len: usize, what: &str) -> Result<usize, String> {
        let i = self.long()?;
        usize::try_from(i)
            .ok()
            .filter(|i| *i < len)
            .ok_or_else(|| format!("{what} {i} is out of range (there are {len})"))
    }

    /// The item count of a collection's next block (None at its end).
    fn block(&mut self, empty_items: bool) -> Result<Option<usize>, String> {
        let mut n = self.long()?;
        if n == 0 {
            return Ok(None);
        }
        if n < 0 {
            // A negative count is followed by the block's size in bytes.
            n = n.checked_neg().ok_or("a block count out of range")?;
            self.long()?;
        }
        let limit = if empty_items {
            MAX_EMPTY_ITEMS
        } else {
            i64::try_from(self.rest.len()).unwrap_or(i64::MAX)
        };
        if n > limit {
            return Err(format!(
                "a block declares {n} items in {} byte(s)",
                self.rest.len()
            ));
        }
        usize::try_from(n)
            .map(Some)
            .map_err(|_| "a block count out of range".to_owned())
    }

    fn prim(&mut self, p: Prim) -> Result<Value, String> {
        Ok(match p {
            Prim::Null => Value::Null,
            Prim::Boolean => match self.take(1)? {
                [0] => Value::Boolean(false),
                [1] => Value::Boolean(true),
                [b] => return Err(format!("{b} is not a boolean")),
                _ => return Err(SHORT.to_owned()),
            },
            Prim::Int => Value::Int(self.int()?),
            Prim::Long => Value::Long(self.long()?),
            Prim::Float => Value::Float(f32::from_le_bytes(
                self.take(4)?.try_into().map_err(|_| SHORT.to_owned())?,
            )),
            Prim::Double => Value::Double(f64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| SHORT.to_owned())?,
            )),
            Prim::Bytes => {
                let n = self.length()?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            Prim::String => Value::String(self.string()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn schema(s: &str) -> Schema {
        Schema::parse_str(s).unwrap()
    }

    fn write(s: &Schema, v: Value) -> Vec<u8> {
        let mut out = Vec::new();
        apache_avro::writer::datum::GenericDatumWriter::builder(s)
            .build()
            .unwrap()
            .write_value_ref(&mut out, &v)
            .unwrap();
        out
    }

    #[test]
    fn fixed_types_of_one_size_are_told_apart_by_name() {
        let w = schema(
            r#"["null", {"type": "fixed", "name": "A", "size": 2}, {"type": "fixed", "name": "B", "size": 2}]"#,
        );
        let r = schema(
            r#"[{"type": "fixed", "name": "B", "size": 2}, {"type": "fixed", "name": "A", "size": 2}]"#,
        );
        let plan = Plan::new(&w, &[], Some(&r)).unwrap();
        let b = write(&w, Value::Union(2, Box::new(Value::Fixed(2, vec![1, 2]))));
        assert_eq!(
            plan.read(&b).unwrap(),
            Value::Union(0, Box::new(Value::Fixed(2, vec![1, 2])))
        );
        let a = write(&w, Value::Union(1, Box::new(Value::Fixed(2, vec![3, 4]))));
        assert_eq!(
            plan.read(&a).unwrap(),
            Value::Union(1, Box::new(Value::Fixed(2, vec![3, 4])))
        );
        let null = write(&w, Value::Union(0, Box::new(Value::Null)));
        let e = plan.read(&null).unwrap_err();
        assert!(e.contains("no branch"), "{e}");
    }

    #[test]
    fn bytes_and_fixed_defaults_are_code_points_one_per_byte() {
        let w = schema(r#"{"type": "record", "name": "R", "fields": []}"#);
        let r = schema(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "b", "type": "bytes", "default": "\u0001\u00e9"},
                {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}, "default": "\u00ffa"}]}"#,
        );
        let plan = Plan::new(&w, &[], Some(&r)).unwrap();
        assert_eq!(
            plan.read(&[]).unwrap(),
            Value::Record(vec![
                ("b".into(), Value::Bytes(vec![1, 0xe9])),
                ("f".into(), Value::Fixed(2, vec![0xff, b'a'])),
            ])
        );
        let wrong = schema(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "f", "type": {"type": "fixed", "name": "F", "size": 3}, "default": "ab"}]}"#,
        );
        assert!(Plan::new(&w, &[], Some(&wrong)).is_err());
    }

    #[test]
    fn declared_lengths_never_outrun_the_bytes() {
        // An array of longs that claims 2^40 items in three bytes, a string
        // that claims 512 MiB: refused before anything is allocated.
        let longs = schema(r#"{"type": "array", "items": "long"}"#);
        let plan = Plan::new(&longs, &[], None).unwrap();
        let mut huge = Vec::new();
        let mut z = (1u64 << 40) << 1;
        while z >= 0x80 {
            huge.push((z as u8) | 0x80);
            z >>= 7;
        }
        huge.push(z as u8);
        huge.extend([2, 4, 0]);
        let e = plan.read(&huge).unwrap_err();
        assert!(e.contains("declares"), "{e}");
        let string = Plan::new(&Schema::String, &[], None).unwrap();
        let e = string
            .read(&[0x80, 0x80, 0x80, 0x80, 0x04, b'a'])
            .unwrap_err();
        assert!(e.contains("ends before"), "{e}");
        // Items that take no bytes at all are bounded by count.
        let nulls = Plan::new(&schema(r#"{"type": "array", "items": "null"}"#), &[], None).unwrap();
        let e = nulls.read(&huge[..huge.len() - 3]).unwrap_err();
        assert!(e.contains("declares"), "{e}");
        assert_eq!(
            nulls.read(&[6, 0]).unwrap(),
            Value::Array(vec![Value::Null; 3])
        );
    }

    #[test]
    fn malformed_primitives_are_refused() {
        let b = Plan::new(&Schema::Boolean, &[], None).unwrap();
        assert!(b.read(&[2]).unwrap_err().contains("not a boolean"));
        let s = Plan::new(&Schema::String, &[], None).unwrap();
        assert!(s.read(&[2, 0xff]).unwrap_err().contains("UTF-8"));
        let i = Plan::new(&Schema::Int, &[], None).unwrap();
        assert!(
            i.read(&[0x80, 0x80, 0x80, 0x80, 0x20])
                .unwrap_err()
                .contains("int")
        );
        let l = Plan::new(&Schema::Long, &[], None).unwrap();
        assert!(l.read(&[0xff; 11]).is_err());
        let u = Plan::new(&schema(r#"["null", "int"]"#), &[], None).unwrap();
        assert!(u.read(&[4]).unwrap_err().contains("out of range"));
    }

    #[test]
    fn a_datum_nested_past_the_limit_is_refused_not_followed() {
        let list = schema(
            r#"{"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}"#,
        );
        let plan = Plan::new(&list, &[], None).unwrap();
        let mut deep = vec![2u8; 10_000];
        deep.push(0);
        let e = plan.read(&deep).unwrap_err();
        assert!(e.contains("deeper"), "{e}");
        let mut shallow = vec![2u8; 100];
        shallow.push(0);
        assert!(plan.read(&shallow).is_ok());
    }

    /// A schema with most kinds in it, for the round trip below.
    fn rich() -> Schema {
        schema(
            r#"{"type": "record", "name": "R", "namespace": "t", "fields": [
                {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
                {"name": "d", "type": "double"}, {"name": "s", "type": "string"},
                {"name": "b", "type": "bytes"}, {"name": "ok", "type": "boolean"},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}},
                {"name": "u", "type": ["null", "string", "long"]},
                {"name": "a", "type": {"type": "array", "items": "int"}},
                {"name": "m", "type": {"type": "map", "values": ["null", "E"]}}]}"#,
        )
    }

    proptest! {
        /// Reading a datum with its own schema gives back the value
        /// apache-avro wrote, for any value of the schema.
        #[test]
        fn a_datum_read_with_its_own_schema_is_the_value_written(
            i in any::<i32>(), l in any::<i64>(), d in -1e12f64..1e12, s in ".{0,12}",
            b in proptest::collection::vec(any::<u8>(), 0..12), ok in any::<bool>(),
            e in 0u32..3, u in 0u32..3, a in proptest::collection::vec(any::<i32>(), 0..20),
            m in proptest::collection::btree_map("[a-z]{1,4}", proptest::option::of(0u32..3), 0..5),
        ) {
            let sym = |e: u32| ["X", "Y", "Z"][e as usize].to_owned();
            let v = Value::Record(vec![
                ("i".into(), Value::Int(i)),
                ("l".into(), Value::Long(l)),
                ("d".into(), Value::Double(d)),
                ("s".into(), Value::String(s.clone())),
                ("b".into(), Value::Bytes(b)),
                ("ok".into(), Value::Boolean(ok)),
                ("e".into(), Value::Enum(e, sym(e))),
                ("u".into(), match u {
                    0 => Value::Union(0, Box::new(Value::Null)),
                    1 => Value::Union(1, Box::new(Value::String(s))),
                    _ => Value::Union(2, Box::new(Value::Long(l))),
                }),
                ("a".into(), Value::Array(a.into_iter().map(Value::Int).collect())),
                ("m".into(), Value::Map(m.into_iter().map(|(k, e)| (k, match e {
                    None => Value::Union(0, Box::new(Value::Null)),
                    Some(e) => Value::Union(1, Box::new(Value::Enum(e, sym(e)))),
                })).collect())),
            ]);
            let r = rich();
            let bytes = write(&r, v.clone());
            let plan = Plan::new(&r, &[], None).unwrap();
            prop_assert_eq!(plan.read(&bytes).unwrap(), v);
            for cut in 0..bytes.len() {
                prop_assert!(plan.read(&bytes[..cut]).is_err());
            }
        }
    }
}
