-- innet's INC packets in Wireshark and tshark: a heuristic dissector on the payload of
-- RoCEv2 (InfiniBand) UD SEND packets. It recognises the INC header by its tags ("INC1" …
-- "MPIr") and decodes it, a data body (elements by type, MINLOC/MAXLOC value-location
-- pairs) or the 148-byte control body (with its switch path), every field by name.
--
--   wireshark -X lua_script:tools/wireshark/innet.lua capture.pcap
--   tshark -X lua_script:tools/wireshark/innet.lua -r capture.pcap -Y innet -V
--
-- Or copy it to ~/.local/lib/wireshark/plugins/. The layout is innet-common's `wire`
-- module (docs/wire-format.md); the tests check every field against the codec.

local innet = Proto("innet", "innet in-network computing (INC)")

local TAG_LOW = 0x494e4331 -- "INC1"
local TAG_HIGH = 0x4d504972 -- "MPIr"
local INC_LEN = 22
local CONTROL_LEN = 148
local PATH_HOPS = 7
local CONTROL_COMM_ID = 0xff

local kinds = { [0] = "data", [1] = "query", [2] = "notify", [3] = "kill" }
local ops = {
    [0] = "sum", [1] = "prod", [2] = "min", [3] = "max", [4] = "band", [5] = "bor",
    [6] = "bxor", [7] = "land", [8] = "lor", [9] = "lxor", [10] = "minloc", [11] = "maxloc",
}
local dtypes = {
    [0] = "int8", [1] = "int16", [2] = "int32", [3] = "int64", [4] = "uint8",
    [5] = "uint16", [6] = "uint32", [7] = "uint64", [8] = "float32", [9] = "float64",
    [10] = "float16", [11] = "bfloat16",
}
local widths = { [0] = 1, 2, 4, 8, 1, 2, 4, 8, 4, 8, 2, 2 }
-- Exponent and fraction bits of the 16-bit floats (TvbRange reads only 4- and 8-byte ones).
local halves = { [10] = { 5, 10 }, [11] = { 8, 7 } }
local masters = { [0] = "node", [1] = "socket", [2] = "nic tree", [3] = "dpu setup" }

local f = innet.fields
-- INC header.
f.tag_low = ProtoField.uint32("innet.tag_low", "Tag (low)", base.HEX)
f.src_rank = ProtoField.uint32("innet.src_rank", "Source rank")
f.kind = ProtoField.uint8("innet.kind", "Kind", base.DEC, kinds)
f.group = ProtoField.uint24("innet.group", "Wire group id", base.HEX)
f.comm_id = ProtoField.uint8("innet.comm_id", "comm_id", base.HEX)
f.comm_id_hi = ProtoField.uint16("innet.comm_id_hi", "comm_id_hi", base.HEX)
f.op = ProtoField.uint8("innet.op", "Op", base.DEC, ops)
f.dtype = ProtoField.uint8("innet.dtype", "Type", base.DEC, dtypes)
f.req_id = ProtoField.uint8("innet.req_id", "Round (req_id)")
f.req_pkt_num = ProtoField.uint8("innet.req_pkt_num", "Packet in message")
f.count = ProtoField.uint16("innet.count", "Elements (pkt_para_num)")
f.tag_high = ProtoField.uint32("innet.tag_high", "Tag (high)", base.HEX)
-- Data body.
f.int = ProtoField.int64("innet.int", "Element")
f.uint = ProtoField.uint64("innet.uint", "Element")
f.float = ProtoField.double("innet.float", "Element")
f.loc = ProtoField.int32("innet.loc", "Location")
f.pad = ProtoField.bytes("innet.pad", "Pad")
-- Control body (ControlPayload).
f.sup_mpi_type = ProtoField.uint16("innet.ctl.sup_mpi_type", "sup_mpi_type", base.HEX)
f.fail_cause = ProtoField.uint8("innet.ctl.fail_cause", "fail_cause")
f.master_num = ProtoField.uint8("innet.ctl.master_num", "master_num", base.DEC, masters)
f.query_notify_hop = ProtoField.uint8("innet.ctl.query_notify_hop", "query_notify_hop", base.HEX)
f.response = ProtoField.bool("innet.ctl.response", "Answer (notify)", 8, nil, 0x80)
f.hops = ProtoField.uint8("innet.ctl.hops", "Switches crossed", base.DEC, nil, 0x7f)
f.sup_comm_type = ProtoField.uint8("innet.ctl.sup_comm_type", "sup_comm_type")
f.sup_allreduce_op = ProtoField.uint16("innet.ctl.sup_allreduce_op", "sup_allreduce_op", base.HEX)
f.sup_data_type = ProtoField.uint16("innet.ctl.sup_data_type", "sup_data_type", base.HEX)
f.sup_max_data_size = ProtoField.uint16("innet.ctl.sup_max_data_size", "sup_max_data_size")
f.global_group_size = ProtoField.uint16("innet.ctl.global_group_size", "global_group_size")
f.local_group_size = ProtoField.uint16("innet.ctl.local_group_size", "local_group_size")
f.true_comm_id = ProtoField.uint32("innet.ctl.true_comm_id", "true_comm_id", base.HEX)
f.ava_grp_num = ProtoField.uint32("innet.ctl.ava_grp_num", "ava_grp_num")
f.dst_rank = ProtoField.uint32("innet.ctl.dst_rank", "dst_rank")
f.tor1_ip = ProtoField.ipv4("innet.ctl.tor1_ip", "tor1_ip")
f.spine_ip = ProtoField.ipv4("innet.ctl.spine_ip", "spine_ip")
f.tor2_ip = ProtoField.ipv4("innet.ctl.tor2_ip", "tor2_ip")
f.job_id = ProtoField.uint64("innet.ctl.job_id", "job_id", base.HEX)
f.c_id = ProtoField.uint32("innet.ctl.c_id", "c_id")
f.world_rank = ProtoField.uint32("innet.ctl.world_rank", "world_rank")
f.sup_window = ProtoField.uint16("innet.ctl.sup_window", "sup_window")
f.rsv = ProtoField.uint16("innet.ctl.rsv", "rsv", base.HEX)
f.path_hops = ProtoField.uint8("innet.path.n_hops", "Hops")
f.path_turn = ProtoField.uint8("innet.path.turn", "Turn (notify, kill)")
f.path_rsv = ProtoField.uint16("innet.path.rsv", "rsv", base.HEX)
f.hop_ip = ProtoField.ipv4("innet.path.ip", "Switch")
f.hop_parent = ProtoField.ipv4("innet.path.parent", "Parent (notify, kill)")
f.hop_free = ProtoField.uint16("innet.path.free", "Free groups (query, climb)")
f.hop_children = ProtoField.uint8("innet.path.children", "Children (notify, kill)")
f.hop_uplinks = ProtoField.uint8("innet.path.uplinks", "Uplinks (query, climb)")

-- (field, bytes) in ControlPayload order.
local control_fields = {
    { f.sup_mpi_type, 2 }, { f.fail_cause, 1 }, { f.master_num, 1 },
    { f.query_notify_hop, 1 }, { f.sup_comm_type, 1 }, { f.sup_allreduce_op, 2 },
    { f.sup_data_type, 2 }, { f.sup_max_data_size, 2 }, { f.global_group_size, 2 },
    { f.local_group_size, 2 }, { f.true_comm_id, 4 }, { f.ava_grp_num, 4 },
    { f.dst_rank, 4 }, { f.tor1_ip, 4 }, { f.spine_ip, 4 }, { f.tor2_ip, 4 },
    { f.job_id, 8 }, { f.c_id, 4 }, { f.world_rank, 4 }, { f.sup_window, 2 }, { f.rsv, 2 },
}

local function control_body(tvb, tree)
    local t = tree:add(innet, tvb(0, CONTROL_LEN), "Control body")
    local off = 0
    for _, field in ipairs(control_fields) do
        local item = t:add(field[1], tvb(off, field[2]))
        if field[1] == f.query_notify_hop then
            item:add(f.response, tvb(off, 1))
            item:add(f.hops, tvb(off, 1))
        end
        off = off + field[2]
    end
    local n = tvb(off, 1):uint()
    local p = t:add(innet, tvb(off, CONTROL_LEN - off), string.format("Path: %d hop(s)", n))
    p:add(f.path_hops, tvb(off, 1))
    p:add(f.path_turn, tvb(off + 1, 1))
    p:add(f.path_rsv, tvb(off + 2, 2))
    off = off + 4
    for i = 0, math.min(n, PATH_HOPS) - 1 do
        local h = p:add(innet, tvb(off, 12), string.format("Hop %d", i))
        h:add(f.hop_ip, tvb(off, 4))
        h:add(f.hop_parent, tvb(off + 4, 4))
        h:add(f.hop_free, tvb(off + 8, 2))
        h:add(f.hop_children, tvb(off + 10, 1))
        h:add(f.hop_uplinks, tvb(off + 11, 1))
        off = off + 12
    end
end

-- The value of 16 IEEE bits with `ebits` exponent and `fbits` fraction bits.
local function half_value(bits, ebits, fbits)
    local sign = bits >= 0x8000 and -1 or 1
    local e = math.floor(bits / 2 ^ fbits) % 2 ^ ebits
    local m = bits % 2 ^ fbits
    local bias = 2 ^ (ebits - 1) - 1
    if e == 2 ^ ebits - 1 then
        return m == 0 and sign * math.huge or 0 / 0
    elseif e == 0 then
        -- Scaled first, so that a negative zero keeps its sign (a float times -1).
        return sign * (m * 2 ^ (1 - bias - fbits))
    end
    return sign * ((2 ^ fbits + m) * 2 ^ (e - bias - fbits))
end

local function element(t, tvb, dtype, width)
    if dtype == 8 or dtype == 9 then
        return t:add(f.float, tvb, tvb:float())
    elseif halves[dtype] then
        local h = halves[dtype]
        return t:add(f.float, tvb, half_value(tvb:uint(), h[1], h[2]))
    elseif dtype <= 3 then
        return t:add(f.int, tvb, tvb:int64())
    else
        return t:add(f.uint, tvb, tvb:uint64())
    end
end

local function data_body(tvb, tree, op, dtype, count)
    local width = widths[dtype]
    if width == nil then
        return
    end
    local loc = (op == 10 or op == 11)
    local size = width + (loc and 4 or 0)
    local len = math.min(count * size, tvb:len())
    local t = tree:add(innet, tvb(0, len), string.format("Data body: %d × %s%s", count,
        dtypes[dtype], loc and " + location" or ""))
    for i = 0, count - 1 do
        local off = i * size
        if off + size > tvb:len() then
            break
        end
        element(t, tvb(off, width), dtype, width)
        if loc then
            t:add(f.loc, tvb(off + width, 4))
        end
    end
    return len
end

local function heuristic(tvb, pinfo, tree)
    if tvb:len() < INC_LEN or tvb(0, 4):uint() ~= TAG_LOW or tvb(18, 4):uint() ~= TAG_HIGH then
        return false
    end
    local kind = tvb(8, 1):uint()
    local comm_id = tvb(9, 1):uint()
    local group = tvb(10, 2):uint() * 256 + comm_id
    local op, dtype, count = tvb(12, 1):uint(), tvb(13, 1):uint(), tvb(16, 2):uint()
    pinfo.cols.protocol = "innet"
    local t = tree:add(innet, tvb(), "innet INC")
    local h = t:add(innet, tvb(0, INC_LEN), "INC header")
    h:add(f.tag_low, tvb(0, 4))
    h:add(f.src_rank, tvb(4, 4))
    h:add(f.kind, tvb(8, 1))
    h:add(f.group, tvb(9, 3), group)
    h:add(f.comm_id, tvb(9, 1))
    h:add(f.comm_id_hi, tvb(10, 2))
    h:add(f.op, tvb(12, 1))
    h:add(f.dtype, tvb(13, 1))
    h:add(f.req_id, tvb(14, 1))
    h:add(f.req_pkt_num, tvb(15, 1))
    h:add(f.count, tvb(16, 2))
    h:add(f.tag_high, tvb(18, 4))
    local body = tvb(INC_LEN):tvb()
    local used
    if comm_id == CONTROL_COMM_ID and body:len() >= CONTROL_LEN then
        control_body(body, t)
        used = CONTROL_LEN
        pinfo.cols.info = string.format("innet %s, comm %08x", kinds[kind] or "?",
            body(16, 4):uint())
    else
        used = data_body(body, t, op, dtype, count) or 0
        pinfo.cols.info = string.format("innet data group %06x round %d: %s %s × %d",
            group, tvb(14, 1):uint(), ops[op] or "?", dtypes[dtype] or "?", count)
    end
    if body:len() > used then
        t:add(f.pad, body(used))
    end
    return true
end

innet:register_heuristic("infiniband.payload", heuristic)
